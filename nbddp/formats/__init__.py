"""The files one room of nbddp writes and another reads: one stdlib-only module for each format."""
