"""The order check: repeated and missing sequence numbers per order_no."""
