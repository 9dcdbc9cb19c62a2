"""`regress`: the regression suite's cases run and compared with the baseline."""
