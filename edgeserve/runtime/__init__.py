"""What runs on the box at serving time: backends, and the server (event loop, queues, executor)."""
