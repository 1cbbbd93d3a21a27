"""`edgeserve train-exits NAME --data FILE.npz`: train, merge and measure an exit head per split point.

numpy, ONNX Runtime and onnx are imported inside the handler, so `edgeserve --help` stays fast.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from pathlib import Path

from edgeserve.errors import positive_int_arg
from edgeserve.exits import TrainExitsError
from edgeserve.manifest import ExitSpec, Manifest, TensorSpec
from edgeserve.repository import ModelRepository, check_model_name, default_root

DESCRIPTION = """\
Add early exits to a model that `edgeserve import --split-at` cut into stages. The stage graphs stay
frozen: they run over the labelled samples of --data (batched, with ONNX Runtime) to give the
features at each split point. A small head (global average pool + one linear layer, trained by
softmax regression on standardised features) is fitted per split point on the training part, merged
into its stage graph as ONNX nodes (the stage's new output `<exit>.logits`), and measured on the
held-out part together with the model's own output. The manifest gets one exit per split point
with its accuracy; the scheduler trades that accuracy against each exit's latency.
"""

EPILOG = """\
--data: an .npz with x (N, *input shape) in the input's dtype, y (N,) integer class labels in the
model's own class order, and optionally class_names (one string per class), e.g.
  np.savez("labelled.npz", x=x.astype(np.float32), y=y, class_names=np.array(["cat", "dog"]))

examples:
  edgeserve import model.onnx --name mynet --split-at layer1_out,layer2_out
  edgeserve train-exits mynet --data labelled.npz
  edgeserve train-exits mynet --data labelled.npz --force --epochs 200   train the heads again
  edgeserve-profile --model mynet                      then measure every exit's latency

See docs/bring-your-own-model.md.
"""


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "train-exits",
        help="train early-exit heads at the split points of an imported model",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("name", metavar="NAME", help="the model in the repository (split into stages)")
    parser.add_argument("--data", type=Path, required=True, metavar="FILE.npz", help="labelled samples: x, y")
    parser.add_argument(
        "--repository",
        type=Path,
        default=None,
        help="model repository (default: $EDGESERVE_REPOSITORY or ./engines)",
    )
    parser.add_argument(
        "--output",
        default=None,
        metavar="OUTPUT_NAME",
        help="the model output that holds the class scores (default: the model's one output)",
    )
    parser.add_argument(
        "--epochs", type=positive_int_arg, default=100, help="passes over the training features (default 100)"
    )
    parser.add_argument(
        "--val-fraction", type=float, default=0.2, help="share held out to measure accuracy (default 0.2)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the split and the training (default 0)")
    parser.add_argument(
        "--batch-size", type=positive_int_arg, default=32, help="samples per backbone run (default 32)"
    )
    parser.add_argument(
        "--threads", type=positive_int_arg, default=None, help="ONNX Runtime threads (default: its own)"
    )
    parser.add_argument("--force", action="store_true", help="replace the exit heads of an earlier run")
    parser.set_defaults(func=train_exits_command)
    return parser


def train_exits_command(args: argparse.Namespace) -> int:
    from edgeserve.exits import heads as onnx_heads
    from edgeserve.exits import train

    repository = ModelRepository(args.repository if args.repository is not None else default_root())
    check_model_name(repository, args.name)
    manifest = repository.load_manifest(args.name)
    plan = train.plan_exits(manifest, args.output, args.force)
    onnx_heads.onnx_module()  # before the long part: say now if onnx is missing
    data = train.load_labelled(args.data, plan)
    train_idx, val_idx = train.split_indices(len(data.y), args.val_fraction, args.seed)
    paths = train.stage_paths(repository.root, manifest)
    name = manifest.name
    splits = plan.split_stages

    print(
        f"{name}: running the frozen backbone ({len(manifest.stages)} stages) over {len(data.y)} samples of "
        f"{args.data.name} to get the features at {len(splits)} split points"
    )
    start = time.perf_counter()
    runner = train.StageRunner(manifest, paths, args.threads)
    with train.progress_bar(len(data.y), f"{name} features") as bar:
        features = train.collect_features(plan, runner, data.x, args.batch_size, bar.update)
    print(f"   ({time.perf_counter() - start:.1f} s)")

    taken = {e.name for e in manifest.exits if e.stage == plan.final_stage}
    exit_names: dict[int, str] = {}
    for k in splits:
        exit_names[k] = train.exit_name_for(manifest.stages[k], taken)
        taken.add(exit_names[k])
    y_train, y_val = data.y[train_idx], data.y[val_idx]
    trained = {
        k: train.train_head(
            features.pooled[k][train_idx], y_train, plan.num_classes, args.epochs, args.seed + k
        )
        for k in splits
    }
    val_accuracy = {k: train.top1(trained[k].logits(features.pooled[k][val_idx]), y_val) for k in splits}
    final_val = train.top1(features.final[val_idx], y_val)
    final_train = train.top1(features.final[train_idx], y_train)

    # Merge each head into a copy of its stage graph; the originals are replaced only after the check.
    staged: dict[int, Path] = {}
    try:
        for k in splits:
            stage = manifest.stages[k]
            model = onnx_heads.load_stage(paths[k])
            onnx_heads.strip_outputs(model, keep=list(stage.passes))
            head = trained[k]
            onnx_heads.attach_head(
                model,
                plan.heads[k],
                head.weight,
                head.bias,
                train.head_output_name(exit_names[k]),
                exit_names[k],
            )
            staged[k] = paths[k].with_name(f".{paths[k].stem}.train-exits.onnx")
            onnx_heads.save_stage(model, staged[k])
        merged_paths = [staged.get(k, p) for k, p in enumerate(paths)]
        check, timings = _check_and_time(plan, trained, exit_names, features, merged_paths, args.threads)
        for k, tmp in staged.items():
            os.replace(tmp, paths[k])
    finally:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)

    new_manifest = _updated_manifest(
        plan, exit_names, val_accuracy, final_val, data.class_names, args, len(train_idx), len(val_idx), check
    )
    repository.save_manifest(new_manifest)
    repository.load_manifest(name)  # the checksums of the new graphs, read back

    sizes = [p.stat().st_size for p in paths]
    rows = [
        (
            exit_names[k],
            k,
            features.pooled[k].shape[1],
            trained[k].train_accuracy,
            val_accuracy[k],
            timings[k],
            sum(sizes[: k + 1]),
        )
        for k in splits
    ]
    final_exit = next(e for e in new_manifest.exits if e.stage == plan.final_stage)
    rows.append(
        (
            final_exit.name,
            plan.final_stage,
            None,
            final_train,
            final_val,
            timings[plan.final_stage],
            sum(sizes),
        )
    )
    print(
        f"{name}: top-1 accuracy on the {len(val_idx)} held-out samples ({len(train_idx)} trained on, "
        f"{args.epochs} epochs); cost: one batch of {len(features.sample_x[:TIMED_BATCH])} through "
        "stages 0..k, and the stage graphs' bytes"
    )
    print(_table(rows, timings[plan.final_stage]))
    print(check)
    print(
        f"{name}: wrote {len(splits)} exits ({', '.join(exit_names[k] for k in splits)}) into "
        f"{repository.manifest_path(name)}; the stage graphs changed, so measure the latencies again: "
        f"`edgeserve-profile --model {name} --repository {repository.root}`"
    )
    return 0


TIMED_BATCH = 8
TIMED_RUNS = 3


def _check_and_time(plan, trained, exit_names, features, merged_paths, threads):
    """Run the merged graphs: passed tensors as before, head logits as numpy computes them; time each exit."""
    import numpy as np

    from edgeserve.exits import train

    runner = train.StageRunner(plan.manifest, merged_paths, threads)
    wanted = train.backbone_outputs(plan)
    for k in plan.split_stages:
        wanted[k] = [*wanted[k], train.head_output_name(exit_names[k])]
    x = features.sample_x
    got = runner.run(x, wanted)
    backbone = max(
        float(
            np.max(
                np.abs(got[n].astype(np.float64) - features.sample_passed[n].astype(np.float64)), initial=0.0
            )
        )
        for n in features.sample_passed
    )
    heads = 0.0
    for k in plan.split_stages:
        expected = trained[k].logits(train.head_features(plan, k, features.sample_passed))
        heads = max(heads, float(np.max(np.abs(got[k, train.head_output_name(exit_names[k])] - expected))))
    scale = max(
        1.0, *(float(np.max(np.abs(t.logits(features.pooled[k][: len(x)])))) for k, t in trained.items())
    )
    if backbone > 1e-5 or heads > 1e-3 * scale:
        raise TrainExitsError(
            f"model {plan.manifest.name!r}: the merged stage graphs differ from the backbone "
            f"(max {backbone:.1e}) or from the trained heads (max {heads:.1e}); nothing was written. "
            "This is a bug: report it"
        )
    check = (
        f"check on {len(x)} samples through the merged graphs: max |passed tensors - before| {backbone:.1e}, "
        f"max |ONNX head logits - numpy head| {heads:.1e}"
    )
    batch = x[:TIMED_BATCH]
    timings: dict[int, float] = {}
    for k in [*plan.split_stages, plan.final_stage]:
        outputs = (
            {k: [train.head_output_name(exit_names[k])]} if k in plan.heads else {k: [plan.final_output]}
        )
        runner.run(batch, outputs, upto=k)  # warm-up
        best = float("inf")
        for _ in range(TIMED_RUNS):
            start = time.perf_counter()
            runner.run(batch, outputs, upto=k)
            best = min(best, time.perf_counter() - start)
        timings[k] = best * 1e3
    return check, timings


def _updated_manifest(
    plan, exit_names, val_accuracy, final_val, class_names, args, n_train, n_val, check
) -> Manifest:
    from edgeserve.files import sha256_file

    manifest = plan.manifest
    root = args.repository if args.repository is not None else default_root()
    stages = []
    for stage in manifest.stages:
        if stage.index not in plan.heads:
            stages.append(stage)
            continue
        path = root / manifest.name / stage.path
        logits = TensorSpec(f"{exit_names[stage.index]}.logits", (plan.num_classes,), "float32")
        stages.append(
            replace(
                stage,
                sha256=sha256_file(path),
                size_bytes=path.stat().st_size,
                outputs=(*stage.passed, logits),
            )
        )
    exits = [ExitSpec(exit_names[k], k, val_accuracy[k]) for k in plan.split_stages]
    exits += [replace(e, accuracy=final_val) for e in manifest.exits if e.stage == plan.final_stage]
    if (
        class_names is None
        and manifest.class_names is not None
        and len(manifest.class_names) == plan.num_classes
    ):
        class_names = manifest.class_names
    source = {
        **manifest.source,
        "exit_heads": (
            f"edgeserve train-exits: global average pool + linear (softmax regression, {args.epochs} epochs, "
            f"seed {args.seed}) on {n_train} samples of {args.data.name}; accuracy on {n_val} held out "
            f"(--val-fraction {args.val_fraction}); final output {plan.final_output!r}"
        ),
        "exit_heads_check": check,
    }
    return replace(
        manifest,
        stages=tuple(stages),
        exits=tuple(exits),
        num_classes=plan.num_classes,
        class_names=class_names,
        accuracy_dataset=args.data.name,
        source=source,
    )


def _table(rows, final_ms: float) -> str:
    lines = [
        f"{'exit':<12} {'stage':>5} {'head in':>8} {'train':>7} {'held-out':>9} {'ms/batch':>9} "
        f"{'vs final':>8} {'KiB 0..k':>9}",
        "-" * 75,
    ]
    for name, stage, width, train_acc, val_acc, ms, size in rows:
        head = "model" if width is None else str(width)
        lines.append(
            f"{name:<12} {stage:>5} {head:>8} {train_acc:>7.1%} {val_acc:>9.1%} {ms:>9.2f} "
            f"{ms / final_ms:>8.0%} {size / 1024:>9.0f}"
        )
    return "\n".join(lines)
