"""Buffer planning for chained TensorRT stages: shapes, bytes and shared buffers per stage and batch."""

from __future__ import annotations

import pytest
from tiny_onnx import TinyRepository

from edgeserve.runtime.backends.buffer_plan import plan_buffers

# tiny_b: input (3,16,16); stage0 -> features (16,16,16) + logits (7); stage1 -> features (32,8,8);
# stage2 -> logits (7). All float32.


def test_allocations_are_sized_for_the_max_batch_and_only_the_ends_have_host_twins(
    tiny_repository: TinyRepository,
) -> None:
    plan = plan_buffers(tiny_repository.repository.load_manifest("tiny_b"), max_batch=10)
    sizes = {a.name: (a.nbytes, a.host) for a in plan.allocations}
    assert sizes == {
        "input": (10 * 3 * 16 * 16 * 4, True),
        "stage0.features": (10 * 16 * 16 * 16 * 4, False),
        "stage0.logits": (10 * 7 * 4, True),
        "stage1.features": (10 * 32 * 8 * 8 * 4, False),
        "stage2.logits": (10 * 7 * 4, True),
    }
    assert plan.device_bytes == sum(n for n, _ in sizes.values())
    assert plan.host_bytes == sizes["input"][0] + 2 * sizes["stage0.logits"][0]


def test_each_stage_reads_the_previous_stages_features_buffer(tiny_repository: TinyRepository) -> None:
    plan = plan_buffers(tiny_repository.repository.load_manifest("tiny_b"), max_batch=4)
    assert plan.bindings(0, 2).binding("x").allocation == "input"
    assert plan.bindings(1, 2).binding("x").allocation == "stage0.features"
    assert plan.bindings(2, 2).binding("x").allocation == "stage1.features"
    assert plan.bindings(0, 2).binding("features").allocation == "stage0.features"


@pytest.mark.parametrize("batch", [1, 3, 10])
def test_shapes_and_bytes_follow_the_batch(tiny_repository: TinyRepository, batch: int) -> None:
    plan = plan_buffers(tiny_repository.repository.load_manifest("tiny_b"), max_batch=10)
    stage0 = plan.bindings(0, batch)
    assert stage0.profile == batch - 1
    by_name = {b.tensor: (b.shape, b.nbytes, b.is_input) for b in stage0.bindings}
    assert by_name == {
        "x": ((batch, 3, 16, 16), batch * 3 * 16 * 16 * 4, True),
        "features": ((batch, 16, 16, 16), batch * 16 * 16 * 16 * 4, False),
        "logits": ((batch, 7), batch * 7 * 4, False),
    }
    headless = {b.tensor for b in plan.bindings(1, batch).bindings}
    assert headless == {"x", "features"}
    last = {b.tensor for b in plan.bindings(2, batch).bindings}
    assert last == {"x", "logits"}


def test_every_binding_fits_its_allocation(tiny_repository: TinyRepository) -> None:
    for name in ("tiny_a", "tiny_b"):
        plan = plan_buffers(tiny_repository.repository.load_manifest(name), max_batch=6)
        for stage in plan.stages:
            for per_batch in stage:
                for b in per_batch.bindings:
                    assert b.nbytes <= plan.allocation(b.allocation).nbytes


def test_batch_outside_the_engines_range_is_refused(tiny_repository: TinyRepository) -> None:
    plan = plan_buffers(tiny_repository.repository.load_manifest("tiny_a"), max_batch=4)
    with pytest.raises(ValueError, match=r"batch 5 is outside the engines' range 1\.\.4"):
        plan.bindings(0, 5)
    with pytest.raises(ValueError, match="max batch must be >= 1"):
        plan_buffers(tiny_repository.repository.load_manifest("tiny_a"), max_batch=0)
