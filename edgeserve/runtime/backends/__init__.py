"""Backends run one model's exits on one device, behind the `Backend` protocol in base.py.

select.py picks one by name; onnxruntime.py is the default, tensorrt.py (with its engine cache,
buffer plan, CUDA runtime and builder) serves a Jetson or a GPU, torch.py serves a model unexported.
"""
