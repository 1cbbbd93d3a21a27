"""Programs that drive a server from outside: bench, send, the delay proxy, build-engines, the demo.
Nothing in the package imports them."""
