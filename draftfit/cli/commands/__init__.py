"""One module per CLI command; each imports heavy packages only inside its function."""
