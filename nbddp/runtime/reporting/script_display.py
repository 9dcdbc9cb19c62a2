"""`display(...)` for a script: inside Jupyter, IPython makes `display` a builtin, and notebook cells call it bare
(`display(dataset[0])`); run by python or torchrun, the same line raises NameError. `setup` installs this one in
script mode when there is none, so those cells print instead.
"""


def display(*objects, **options):
    """Print each object's repr on its own line, as IPython shows it as plain text.

    IPython's keyword options (include, exclude, metadata, display_id, ...) mean nothing on a console: ignored.
    """
    for shown in objects:
        print(repr(shown))
