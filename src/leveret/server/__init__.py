"""The event loop, listeners and lifecycle of a running broker."""
