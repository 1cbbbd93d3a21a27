"""What runs on the box at serving time: backends, and (later) the event loop, queues and executor."""
