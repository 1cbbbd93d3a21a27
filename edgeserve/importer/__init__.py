"""`edgeserve import`: bring an ONNX model from anywhere into the repository.

See docs/bring-your-own-model.md.
"""
