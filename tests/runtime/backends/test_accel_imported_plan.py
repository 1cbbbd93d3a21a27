"""Planning TensorRT engines and buffers for imported (schema-2) models, without TensorRT.

What runs here is the pure planning the TensorRT path relies on: optimization-profile shapes per
input, batch plans, buffers per tensor in each engine's type, and which buffer feeds which engine
input. The TensorRT and CUDA calls that consume these plans (tensorrt_build.EngineBuilder with one
profile, tensorrt_imported.open_imported / run_imported) have never been executed: this project has
no GPU and no TensorRT. Nothing here pretends to run inference.
"""

from __future__ import annotations

import argparse
import ctypes
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from fake_engines import write_engine
from tiny_onnx import TinyRepository

from edgeserve.errors import InputError
from edgeserve.files import sha256_file
from edgeserve.manifest import ExitSpec, Manifest, StageSpec, TensorSpec
from edgeserve.onnx_graph import sample_batch
from edgeserve.repository import ModelRepository
from edgeserve.runtime.backends.buffer_plan import plan_tensors, profile_shapes, tensorrt_refusal
from edgeserve.runtime.backends.cuda_runtime import host_view
from edgeserve.runtime.backends.engine_cache import (
    BatchPlan,
    BuildTarget,
    EngineRecord,
    batch_plan,
    format_plan,
    graph_float_dtype,
    load_current_record,
    per_batch_chain,
    plan_builds,
    record_path,
    stale_reasons,
)
from edgeserve.runtime.backends.onnxruntime import graph_feeds
from edgeserve.runtime.backends.tensorrt_imported import check_profiles, refuse_unservable
from edgeserve.runtime.validation import validate_feeds
from edgeserve.tools.build_engines import add_parser

ORIN = BuildTarget("Orin (nvgpu)", "8.7", "10.3.0", "fp32")


def t(name: str, shape: tuple[int, ...], dtype: str = "float32", batched: bool = True) -> TensorSpec:
    return TensorSpec(name, shape, dtype, batched)


def stage(index: int, inputs: list[TensorSpec], outputs: list[TensorSpec], **kw: object) -> StageSpec:
    return StageSpec(index, f"stage{index}.onnx", "0" * 64, 1, tuple(inputs), tuple(outputs), **kw)  # type: ignore[arg-type]


def detector(**changes: object) -> Manifest:
    """Two inputs; stage 0 passes `hidden` and gives a `score` exit; stage 1 takes `hidden` and the
    model input `scale` again and gives boxes (float32) and labels (int64)."""
    manifest = Manifest(
        name="det",
        inputs=(t("image", (3, 8, 8)), t("scale", (2,))),
        stages=(
            stage(
                0,
                [t("image", (3, 8, 8)), t("scale", (2,))],
                [t("hidden", (16, 4, 4)), t("score", (1,))],
                passes=("hidden",),
            ),
            stage(
                1,
                [t("hidden", (16, 4, 4)), t("scale", (2,))],
                [t("boxes", (5, 4)), t("labels", (5,), "int64")],
            ),
        ),
        exits=(ExitSpec("early", 0), ExitSpec("final", 1)),
        source={"imported_from": "det.onnx"},
    )
    manifest = replace(manifest, **changes)  # type: ignore[arg-type]
    manifest.validate()
    return manifest


def with_scale(dtype: str) -> Manifest:
    """detector() with its `scale` input (model input and both stages' inputs) of type `dtype`."""
    base = detector()

    def retype(spec: StageSpec) -> StageSpec:
        inputs = tuple(replace(x, dtype=dtype) if x.name == "scale" else x for x in spec.inputs)
        return replace(spec, inputs=inputs)

    return detector(
        inputs=(base.inputs[0], replace(base.inputs[1], dtype=dtype)),
        stages=tuple(retype(s) for s in base.stages),
    )


def unbatched() -> Manifest:
    """One image with a batch dimension of its own and a scalar threshold the graph takes without one."""
    inputs = (t("pixels", (1, 3, 6, 6), batched=False), t("threshold", (), batched=False))
    manifest = Manifest(
        name="one-at-a-time",
        inputs=inputs,
        stages=(stage(0, list(inputs), [t("mask", (1, 6, 6), "bool", batched=False)]),),
        exits=(ExitSpec("final", 0),),
    )
    manifest.validate()
    return manifest


# -- batch plans and profile shapes -------------------------------------------------------------------


def test_exported_chains_keep_one_profile_per_batch_size(tiny_repository: TinyRepository) -> None:
    manifest = tiny_repository.repository.load_manifest("tiny_b")
    assert per_batch_chain(manifest)
    assert batch_plan(manifest, 6) == BatchPlan((1, 2, 3, 4, 5, 6), None)


def test_dynamic_batch_gets_one_profile_from_1_to_max_tuned_for_opt() -> None:
    assert not per_batch_chain(detector())
    assert batch_plan(detector(), 8) == BatchPlan(tuple(range(1, 9)), (1, 8, 8))
    assert batch_plan(detector(), 8, opt_batch=4).profile == (1, 4, 8)
    assert batch_plan(detector(), 8, opt_batch=32).profile == (1, 8, 8), "opt is capped at max"
    with pytest.raises(ValueError, match="opt batch"):
        batch_plan(detector(), 8, opt_batch=0)


def test_fixed_batch_serves_1_to_n_padded_with_n_for_min_opt_and_max() -> None:
    plan = batch_plan(detector(batch=4), max_batch=10)
    assert plan == BatchPlan((1, 2, 3, 4), (4, 4, 4))
    assert "min 4 opt 4 max 4" in plan.describe()


def test_a_model_with_unbatched_tensors_runs_one_sample_at_a_time() -> None:
    assert batch_plan(unbatched(), max_batch=10) == BatchPlan((1,), (1, 1, 1))


def test_a_single_input_classifier_with_a_fixed_batch_is_not_served_as_a_chain(
    tiny_repository: TinyRepository,
) -> None:
    manifest = replace(tiny_repository.repository.load_manifest("tiny_a"), batch=2)
    assert not per_batch_chain(manifest)
    assert batch_plan(manifest).profile == (2, 2, 2)


def test_profile_shapes_cover_every_input_of_the_stage() -> None:
    shapes = {p.name: (p.min, p.opt, p.max) for p in profile_shapes(detector(), 1, (1, 4, 8))}
    assert shapes == {
        "hidden": ((1, 16, 4, 4), (4, 16, 4, 4), (8, 16, 4, 4)),
        "scale": ((1, 2), (4, 2), (8, 2)),
    }


def test_unbatched_inputs_have_their_full_static_shape_in_the_profile() -> None:
    shapes = {p.name: (p.min, p.opt, p.max) for p in profile_shapes(unbatched(), 0, (1, 1, 1))}
    assert shapes == {"pixels": ((1, 3, 6, 6),) * 3, "threshold": ((), (), ())}


@pytest.mark.parametrize("batches", [(0, 1, 1), (2, 1, 4), (1, 5, 4)])
def test_profile_batches_must_be_ordered(batches: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError, match="min <= opt <= max"):
        profile_shapes(detector(), 0, batches)


# -- buffers and wiring -------------------------------------------------------------------------------


def test_buffers_per_tensor_sized_at_the_largest_batch_with_host_twins_only_at_the_ends() -> None:
    plan = plan_tensors(detector(), max_batch=8)
    buffers = {b.name: (b.dtype, b.shape, b.nbytes, b.host) for b in plan.buffers}
    assert buffers == {
        "input.image": ("float32", (8, 3, 8, 8), 8 * 3 * 8 * 8 * 4, True),
        "input.scale": ("float32", (8, 2), 8 * 2 * 4, True),
        "stage0.hidden": ("float32", (8, 16, 4, 4), 8 * 16 * 4 * 4 * 4, False),
        "stage0.score": ("float32", (8, 1), 8 * 4, True),
        "stage1.boxes": ("float32", (8, 5, 4), 8 * 5 * 4 * 4, True),
        "stage1.labels": ("int64", (8, 5), 8 * 5 * 8, True),
    }
    assert plan.device_bytes == sum(n for _, _, n, _ in buffers.values())
    assert plan.host_bytes == plan.device_bytes - buffers["stage0.hidden"][2]


def test_stages_read_model_inputs_and_passed_tensors_by_name() -> None:
    plan = plan_tensors(detector(), max_batch=8)
    assert plan.model_inputs == (("image", "input.image"), ("scale", "input.scale"))
    assert [(w.tensor.name, w.buffer) for w in plan.stages[1].inputs] == [
        ("hidden", "stage0.hidden"),
        ("scale", "input.scale"),  # a model input taken again by a later stage: one buffer
    ]
    assert [w.tensor.name for w in plan.stages[0].exit_outputs] == ["score"]
    assert [w.tensor.name for w in plan.stages[1].exit_outputs] == ["boxes", "labels"]


def test_sources_feed_an_input_named_differently() -> None:
    base = detector()
    renamed = stage(
        1, [t("x", (16, 4, 4)), t("s", (2,))], list(base.stages[1].outputs), sources=("hidden", "scale")
    )
    plan = plan_tensors(detector(stages=(base.stages[0], renamed)), max_batch=2)
    assert plan.stages[1].wire("x").buffer == "stage0.hidden"
    assert plan.stages[1].wire("s").buffer == "input.scale"


def test_engine_types_size_the_buffers_and_shapes_follow_the_batch() -> None:
    plan = plan_tensors(detector(), max_batch=8, dtypes={(1, "labels"): "int32", (0, "image"): "float16"})
    assert plan.buffer("stage1.labels").dtype == "int32"
    assert plan.buffer("stage1.labels").nbytes == 8 * 5 * 4
    assert plan.buffer("input.image").dtype == "float16"
    labels = plan.stages[1].wire("labels")
    assert labels.dtype == "int32" and labels.tensor.dtype == "int64", "clients still get the manifest's type"
    assert labels.shape(3) == (3, 5) and labels.nbytes(3) == 3 * 5 * 4


def test_a_passed_tensor_must_have_one_type_on_both_sides() -> None:
    with pytest.raises(ValueError, match=r"stage 1 takes 'hidden' as float16, but 'hidden' is float32"):
        plan_tensors(detector(), max_batch=2, dtypes={(1, "hidden"): "float16"})


def test_stages_taking_one_model_input_must_agree_on_its_type() -> None:
    with pytest.raises(ValueError, match="'scale'"):
        plan_tensors(detector(), max_batch=2, dtypes={(0, "scale"): "float16", (1, "scale"): "float32"})


def test_an_exit_output_of_a_stage_without_an_exit_is_bound_but_never_copied_back() -> None:
    plan = plan_tensors(detector(exits=(ExitSpec("final", 1),)), max_batch=2)
    assert not plan.buffer("stage0.score").host
    assert plan.buffer("stage1.boxes").host


def test_fixed_batch_buffers_hold_n_and_smaller_batches_run_padded() -> None:
    plan = plan_tensors(detector(batch=4), max_batch=10)
    assert plan.max_batch == 4 and plan.fixed_batch == 4
    assert plan.buffer("input.image").shape == (4, 3, 8, 8)
    assert plan.graph_batch(1) == plan.graph_batch(4) == 4
    with pytest.raises(ValueError, match=r"1\.\.4"):
        plan.graph_batch(5)


@pytest.mark.parametrize(("manifest", "size"), [(detector(), 3), (detector(batch=4), 3), (unbatched(), 1)])
def test_graph_feeds_fill_exactly_the_planned_input_shapes(manifest: Manifest, size: int) -> None:
    """The run path feeds onnxruntime.graph_feeds' arrays into the planned buffers: they must agree."""
    plan = plan_tensors(manifest, max_batch=8)
    feeds, n = graph_feeds(manifest, validate_feeds(manifest, sample_batch(manifest, size)))
    assert n == size
    graph_batch = plan.graph_batch(size)
    for wiring in plan.stages:
        for wire in wiring.inputs:
            if wire.buffer.startswith("input."):
                array = feeds[wire.buffer.removeprefix("input.")]
                assert array.shape == wire.shape(graph_batch)
                assert array.nbytes == wire.nbytes(graph_batch) <= plan.buffer(wire.buffer).nbytes


def test_unbatched_tensors_keep_their_full_shape() -> None:
    plan = plan_tensors(unbatched(), max_batch=8)
    assert plan.max_batch == 1
    assert {b.name: b.shape for b in plan.buffers} == {
        "input.pixels": (1, 3, 6, 6),
        "input.threshold": (),
        "stage0.mask": (1, 6, 6),
    }
    assert plan.buffer("input.threshold").nbytes == 4
    assert plan.buffer("stage0.mask").nbytes == 36


# -- what TensorRT cannot serve -----------------------------------------------------------------------


def test_outputs_sized_by_their_content_are_refused_naming_the_output() -> None:
    base = detector()
    ragged = replace(base.stages[1], outputs=(t("boxes", (-1, 4)), t("labels", (-1,), "int64")))
    manifest = detector(stages=(base.stages[0], ragged))
    assert "stage 1 output 'boxes'" in (tensorrt_refusal(manifest) or "")
    with pytest.raises(InputError, match=r"'boxes'.*onnxruntime"):
        refuse_unservable(manifest)
    with pytest.raises(ValueError, match="IOutputAllocator"):
        plan_tensors(manifest, max_batch=2)


@pytest.mark.parametrize("dtype", ["float64", "int16", "uint16"])
def test_types_tensorrt_has_no_io_type_for_are_refused(dtype: str) -> None:
    manifest = detector(inputs=(t("image", (3, 8, 8)), t("scale", (2,), dtype)))
    assert f"input 'scale' is {dtype}" in (tensorrt_refusal(manifest) or "")


def test_every_numeric_type_tensorrt_has_is_planned() -> None:
    for dtype in ("float32", "float16", "int8", "int32", "int64", "uint8", "bool"):
        manifest = with_scale(dtype)
        assert tensorrt_refusal(manifest) is None
        assert plan_tensors(manifest, 2).buffer("input.scale").dtype == dtype


def test_graph_float_type_for_the_precision_check() -> None:
    assert graph_float_dtype(detector()) == "float32"
    assert graph_float_dtype(detector(inputs=(t("image", (3, 8, 8), "uint8"), t("scale", (2,))))) == "float32"
    assert (
        graph_float_dtype(detector(inputs=(t("image", (3, 8, 8), "float16"), t("scale", (2,))))) == "float16"
    )


# -- engine records and build plans -------------------------------------------------------------------


def test_records_keep_the_batch_profile_and_old_records_read_as_per_batch(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path)
    record = write_engine(repo, detector(), 1, ORIN, max_batch=8, profile=(1, 4, 8))
    path = record_path(repo, "det", ORIN, 1)
    assert EngineRecord.load(path) == record
    assert record.batch_profile == (1, 4, 8)
    chain = write_engine(repo, detector(), 0, ORIN, max_batch=8)
    assert "batch_profile" not in record_path(repo, "det", ORIN, 0).read_text()
    assert EngineRecord.load(record_path(repo, "det", ORIN, 0)).batch_profile is None == chain.batch_profile


def test_another_profile_makes_the_engine_stale(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path)
    record = write_engine(repo, detector(), 0, ORIN, max_batch=8, profile=(1, 8, 8))
    sizes = tuple(range(1, 9))
    assert stale_reasons(record, detector(), 0, ORIN, sizes, (1, 8, 8)) == []
    assert stale_reasons(record, detector(), 0, ORIN, sizes, (1, 4, 8)) == [
        "built with one profile (batch min 1, opt 8, max 8), wanted one profile (batch min 1, opt 4, max 8)"
    ]
    assert stale_reasons(record, detector(), 0, ORIN, sizes) == [
        "built with one profile (batch min 1, opt 8, max 8), wanted one profile per batch size"
    ]


def test_build_plan_for_an_imported_model_names_its_profile(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path)
    write_engine(repo, detector(), 0, ORIN, max_batch=8, profile=(1, 8, 8))
    plan = plan_builds(repo, [detector()], ORIN, max_batch=8)
    assert [(p.action, p.batches) for p in plan] == [
        ("skip", BatchPlan(tuple(range(1, 9)), (1, 8, 8))),
        ("build", BatchPlan(tuple(range(1, 9)), (1, 8, 8))),
    ]
    rebuild = plan_builds(repo, [detector()], ORIN, max_batch=8, opt_batch=2)
    assert rebuild[0].action == "rebuild" and "opt 2" in rebuild[0].reason
    text = format_plan(plan, ORIN)
    assert "[one profile, batch min 1 opt 8 max 8]" in text
    assert text.splitlines()[-1] == "1 to build, 0 to rebuild, 1 current"


def test_build_plan_refuses_what_the_backend_could_not_load(tmp_path: Path) -> None:
    base = detector()
    ragged = replace(base.stages[1], outputs=(t("boxes", (-1, 4)), t("labels", (-1,), "int64")))
    plan = plan_builds(ModelRepository(tmp_path), [detector(stages=(base.stages[0], ragged))], ORIN)
    assert {p.action for p in plan} == {"refuse"}
    assert "--backend onnxruntime" in plan[0].reason
    assert format_plan(plan, ORIN).endswith("0 current, 2 refused (not servable on TensorRT)")


def test_serving_reads_the_recorded_profile_and_engines_must_share_it(tmp_path: Path) -> None:
    repo = ModelRepository(tmp_path)
    records = [
        write_engine(repo, detector(), 0, ORIN, max_batch=8, profile=(1, 8, 8)),
        write_engine(repo, detector(), 1, ORIN, max_batch=8, profile=(1, 8, 8)),
    ]
    assert load_current_record(repo, detector(), 1, ORIN).batch_profile == (1, 8, 8)
    assert check_profiles(detector(), records, "fix") == 8
    records[1] = write_engine(repo, detector(), 1, ORIN, max_batch=8)
    with pytest.raises(Exception, match="per-batch profiles"):
        check_profiles(detector(), records, "fix")


# -- build-engines on an imported model ---------------------------------------------------------------


def _save(repo: ModelRepository, manifest: Manifest) -> Manifest:
    """Write stand-in stage files (the dry run never reads them) and a manifest that matches them."""
    stages = []
    for spec in manifest.stages:
        path = repo.model_dir(manifest.name) / spec.path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"stand-in onnx " + bytes([spec.index]))
        stages.append(replace(spec, sha256=sha256_file(path), size_bytes=path.stat().st_size))
    saved = replace(manifest, stages=tuple(stages))
    repo.save_manifest(saved)
    return saved


def test_build_engines_dry_run_plans_an_imported_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = ModelRepository(tmp_path)
    _save(repo, detector())
    parser = argparse.ArgumentParser(prog="edgeserve")
    add_parser(parser.add_subparsers())
    argv = ["build-engines", "--repository", str(tmp_path), "--dry-run", "--target", "Orin:8.7:10.3.0"]
    args = parser.parse_args([*argv, "--max-batch", "6", "--opt-batch", "3"])
    assert args.func(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:3] for line in lines[1:3]] == [
        ["build", "det", "stage0"],
        ["build", "det", "stage1"],
    ]
    assert all(line.endswith("[one profile, batch min 1 opt 3 max 6]") for line in lines[1:3])


def test_build_engines_help_says_it_builds_imported_models(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="edgeserve")
    add_parser(parser.add_subparsers())
    with pytest.raises(SystemExit):
        parser.parse_args(["build-engines", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Imported models (`edgeserve import`: any inputs and outputs) get one profile per engine" in text
    assert "--opt-batch" in text


# -- pinned host views --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "values"), [("float16", [1.5, -2.0]), ("bool", [True, False]), ("int64", [7, -1])]
)
def test_host_views_cover_every_type_including_float16(dtype: str, values: list[object]) -> None:
    raw = ctypes.create_string_buffer(16)
    view = host_view(ctypes.addressof(raw), 16, dtype)
    assert view.dtype == np.dtype(dtype) and view.nbytes == 16
    view[: len(values)] = values
    assert bytes(raw)[: 2 * np.dtype(dtype).itemsize] == np.array(values, dtype=dtype).tobytes()
