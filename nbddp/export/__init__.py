"""Export room: stage notebooks -> rewrites -> generated/train.py. Never imports torch."""
