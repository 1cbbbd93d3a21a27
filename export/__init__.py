"""`edgeserve.export`: early-exit torch models and their per-stage ONNX export.

Installed as `edgeserve.export` (setup.cfg maps the top-level `export/` folder). Everything here
needs the `export` extra (torch, onnx, onnxscript, scikit-learn) except `cli` and `models` at import
time, which defer torch so that `edgeserve --help` works on a serving box without torch.

    early_exit    the model-agnostic contract (stages, heads, exit names) and the torch reference
    resnet        early-exit ResNet50/101/152 (CIFAR and ImageNet stems, width multiplier)
    digits        the small digits-s/m/l family; digits_data: its fixed split and eval .npz
    train_digits  `python -m edgeserve.export.train_digits`: retrain the committed weights
    state_npz     weights as pickle-free .npz
    onnx_export   one ONNX graph per stage, written into the repository; verify: ORT vs torch
    models        model names -> factories, and `--module package.module:factory`
    cli           `edgeserve export`
"""
