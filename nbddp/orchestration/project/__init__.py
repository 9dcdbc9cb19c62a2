"""The project's files: a new project (`nbddp new`), run folders under runs/, result files written whole."""
