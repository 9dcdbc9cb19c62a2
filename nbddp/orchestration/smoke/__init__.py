"""`smoke`: the generated script run once as a notebook through papermill, a few steps on one device."""
