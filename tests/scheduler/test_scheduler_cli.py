"""`edgeserve simulate`: sources (synthetic, repository, JSON), sweeps, CSV and plots, errors."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest

from edgeserve.cli import main
from edgeserve.errors import ProfileError
from edgeserve.fingerprint import Fingerprint
from edgeserve.manifest import ExitSpec, Manifest, StageSpec, TensorSpec
from edgeserve.profile import ProfileCell, ProfileTable
from edgeserve.repository import ModelRepository
from edgeserve.scheduler.sources import pick_profile
from edgeserve.scheduler.synthetic import batch_scale

FAST = ["--duration", "1", "--warmup-tasks", "10", "--quiet"]


def _rows(out: Path) -> list[dict[str, str]]:
    with (out / "sweep.csv").open() as f:
        return list(csv.DictReader(f))


def test_help_teaches_with_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "examples:" in text and "--paper-gpu" in text and "--auto-rates" in text


def test_paper_gpu_sweep_writes_csv_and_figures_labelled_synthetic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["simulate", "--paper-gpu", "--ratios", "3,2,1", "--loads", "40,200", "--policy", "stability",
                 "--policy", "all-final", "--out", str(tmp_path), *FAST])  # fmt: skip
    assert code == 0
    captured = capsys.readouterr()
    assert "SYNTHETIC" in captured.out and "SYNTHETIC" in captured.err
    rows = _rows(tmp_path)
    overall = [r for r in rows if r["scope"] == "all"]
    assert {(r["policy"], float(r["load_rps"])) for r in overall} == {
        (p, lo) for p in ("stability", "all-final") for lo in (40.0, 200.0)
    }
    assert {r["scope"] for r in rows} == {"all", "ResNet50", "ResNet101", "ResNet152"}
    assert all("SYNTHETIC" in r["profile"] and "theirs" in r["accuracy_source"] for r in rows)
    pngs = sorted(p.name.split("_poisson")[0] for p in tmp_path.glob("*.png"))
    assert pngs == ["accuracy_vs_p95", "exit_mix_vs_load", "p95_violation_vs_load"]
    assert all(p.stat().st_size > 10_000 for p in tmp_path.glob("*.png"))


def test_exit_subsets_slos_mixes_and_bursty_traffic_are_swept(tmp_path: Path) -> None:
    code = main(["simulate", "--paper-gpu", "--policy", "stability", "--loads", "100", "--exits", "all",
                 "--exits", "layer1+final", "--slo-ms", "30,50", "--mix", "ResNet50*2", "--traffic", "bursty",
                 "--no-plots", "--out", str(tmp_path), *FAST])  # fmt: skip
    assert code == 0
    rows = [r for r in _rows(tmp_path) if r["scope"] == "all"]
    assert {(r["exits"], r["slo_ms"]) for r in rows} == {
        (e, s) for e in ("all", "layer1+final") for s in ("30.0", "50.0")
    }
    assert {r["traffic"] for r in rows} == {"bursty"} and {r["mix"] for r in rows} == {"ResNet50*2"}
    subset = [r for r in rows if r["exits"] == "layer1+final"]
    assert all(set(k.split(":")[0] for k in r["exit_mix"].split(";")) <= {"layer1", "final"} for r in subset)
    scopes = {r["scope"] for r in _rows(tmp_path)}
    assert scopes == {"all", "ResNet50", "ResNet50#2"}


def _manifest(name: str) -> Manifest:
    stages = tuple(
        StageSpec.chain(
            index=k,
            path=f"onnx/stage{k}.onnx",
            sha256=f"{k}" * 64,
            size_bytes=100,
            input=TensorSpec("x", (3, 32, 32)),
            logits=TensorSpec("logits", (10,)),
            features=TensorSpec("features", (8, 4, 4)) if k == 0 else None,
        )
        for k in range(2)
    )
    exits = (ExitSpec("layer1", 0), ExitSpec("final", 1))
    return Manifest(
        name=name, inputs=(TensorSpec("x", (3, 32, 32)),), num_classes=10, stages=stages, exits=exits
    )


def _profile(manifest: Manifest, device: str, created: str, scale: float = 1.0) -> ProfileTable:
    table = ProfileTable(
        model=manifest.name,
        exit_names=tuple(manifest.exit_names),
        max_batch=10,
        fingerprint=Fingerprint(backend="onnxruntime-cpu", device=device, threads=1),
        graphs_sha256=manifest.graphs_sha256(),
        created=created,
    )
    for e, ms in enumerate((2.0 * scale, 8.0 * scale)):
        for b in range(1, 11):
            table.add(ProfileCell.from_samples(e, b, [ms * batch_scale(b) * f for f in (0.97, 1.0, 1.05)]))
    return table


def _repository(root: Path) -> tuple[ModelRepository, list[Manifest]]:
    repo = ModelRepository(root)
    manifests = [_manifest("resnet50-tiny"), _manifest("resnet152-tiny")]
    for m in manifests:
        repo.save_manifest(m)
        repo.save_profile(_profile(m, "old-cpu", "2026-01-01T00:00:00", scale=2.0))
        repo.save_profile(_profile(m, "new-cpu", "2026-02-01T00:00:00"))
    return repo, manifests


def test_repository_profiles_pick_the_newest_and_say_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _repository(tmp_path / "engines")
    code = main(["simulate", "--repository", str(tmp_path / "engines"), "--model", "resnet50-tiny",
                 "--model", "resnet152-tiny", "--accuracy-table", "paper", "--auto-rates", "0.5,1.5",
                 "--policy", "stability", "--no-plots", "--out", str(tmp_path / "out"), *FAST])  # fmt: skip
    assert code == 0
    err = capsys.readouterr().err
    assert "resnet50-tiny: profile onnxruntime-cpu-new-cpu" in err and "newest of 2" in err
    assert "All-Final capacity" in err
    rows = [r for r in _rows(tmp_path / "out") if r["scope"] == "all"]
    # Capacity per unit ratio: 1 / sum(final mean at batch 10 / 10) = 1 / (2 * 8 * (18/13) * 1.0067 / 10000)
    capacity = 1.0 / (2 * 8.0 * batch_scale(10) * (0.97 + 1.0 + 1.05) / 3 / 10 / 1000)
    assert sorted(float(r["load_rps"]) for r in rows) == pytest.approx(
        [0.5 * capacity, 1.5 * capacity], rel=1e-3
    )
    assert all(r["accuracy_source"].startswith("EdgeServing authors'") for r in rows)


def test_a_given_fingerprint_key_is_used_and_a_missing_one_is_named(tmp_path: Path) -> None:
    repo, manifests = _repository(tmp_path / "engines")
    old = _profile(manifests[0], "old-cpu", "x", 2.0).fingerprint.key()
    picked = pick_profile(repo, manifests[0], old)
    assert picked.path.stem == old and "as asked" in picked.note
    with pytest.raises(ProfileError, match="no profile with fingerprint 'nope'"):
        pick_profile(repo, manifests[0], "nope")


def test_a_profile_of_an_earlier_export_is_refused_with_the_fix(tmp_path: Path) -> None:
    repo, manifests = _repository(tmp_path / "engines")
    stale = _profile(manifests[0], "new-cpu", "2026-03-01T00:00:00")
    stale.graphs_sha256 = "0" * 64
    repo.save_profile(stale)
    with pytest.raises(ProfileError, match=r"earlier export.*edgeserve-profile --model resnet50-tiny"):
        pick_profile(repo, manifests[0])


def test_profile_json_source_and_missing_accuracy_are_handled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = _profile(_manifest("mobilenet-tiny"), "cpu", "now")
    path = tmp_path / "p.json"
    table.save(path)
    code = main(["simulate", "--profile-json", str(path), "--loads", "50", "--policy", "early-exit-edf",
                 "--no-plots", "--out", str(tmp_path / "out"), *FAST])  # fmt: skip
    assert code == 0
    assert "accuracy: none" in capsys.readouterr().err
    assert _rows(tmp_path / "out")[0]["mean_accuracy_pct"] == ""


def test_no_source_or_unknown_policy_fails_with_what_to_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--out", str(tmp_path)]) == 1
    assert "--paper-gpu" in capsys.readouterr().err
    assert main(["simulate", "--paper-gpu", "--policy", "fifo", "--out", str(tmp_path), *FAST]) == 1
    assert "choose from stability" in capsys.readouterr().err
    assert main(["simulate", "--paper-gpu", "--mix", "VGG16", "--out", str(tmp_path), *FAST]) == 1
    assert "no profile for 'VGG16'" in capsys.readouterr().err


def test_a_dispatch_overhead_adds_to_every_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p50 = []
    for us in ("0", "2000"):
        out = tmp_path / us
        args = ["simulate", "--paper-gpu", "--policy", "all-final", "--loads", "20", "--no-plots",
                "--dispatch-overhead-us", us, "--out", str(out), *FAST]  # fmt: skip
        assert main(args) == 0
        p50.append(next(float(r["p50_ms"]) for r in _rows(out) if r["scope"] == "all"))
    assert p50[1] >= p50[0] + 2.0  # at light load nearly every task meets an idle accelerator
    with pytest.raises(SystemExit):
        main(["simulate", "--paper-gpu", "--dispatch-overhead-us", "-5", "--out", str(tmp_path)])
    assert "must be a finite number >= 0" in capsys.readouterr().err


def test_list_policies_names_the_paper_labels(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--list-policies"]) == 0
    out = capsys.readouterr().out
    for label in ("All-Final+Deadline-Aware", "Ours+bs=1", "Symphony", "Early-Exit+EDF"):
        assert label in out
    assert "* stability-safe " in out and "  stability-safe-maxbatch " in out  # * marks the default
    assert not os.path.exists("out/simulate")
