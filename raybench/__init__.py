"""raybench."""
