"""The directory queue transport: a queue that is a folder."""
