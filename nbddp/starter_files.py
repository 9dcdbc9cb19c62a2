"""The starter project's files (`nbddp new`): folder of the repository -> the patterns of its files the starter holds.

Read by setup.py (which copies them into the wheel as nbddp/starter/) and by nbddp.orchestration.project.new_project;
standard library only, so the build can read it without nbddp's dependencies.
"""
STARTER = {"notebooks": ("[0-9][0-9]_*.ipynb", "[0-9][0-9]_*.py"), "data": ("tiny_instructions.jsonl",),
           "models/tiny-llama": ("*.json",)}
