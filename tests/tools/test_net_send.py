"""`edgeserve send` against a real server: synthetic inputs, a .npy stack and an image file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from net_support import net_config, server_thread
from runtime_support import config_dict, profiled_tiny_repository

from edgeserve.cli import main as cli_main


@pytest.fixture(scope="module")
def served_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("send") / "engines"
    profiled_tiny_repository(root)
    return root


def test_send_prints_one_answer_per_input(served_root: Path, tmp_path: Path, capsys) -> None:
    config = config_dict(served_root)
    config["models"]["tiny_b"]["preprocess"] = {"channels": "rgb"}
    stack = np.random.default_rng(2).standard_normal((4, 1, 8, 8)).astype(np.float32)
    np.save(tmp_path / "stack.npy", stack)
    pil = pytest.importorskip("PIL.Image")
    pil.fromarray(np.full((20, 24, 3), 128, dtype=np.uint8)).save(tmp_path / "frame.png")
    with server_thread(net_config(config, tmp_path)) as srv:
        target = ["send", "--target", srv.unix_url]
        assert cli_main([*target, "--model", "tiny_a", "--synthetic", "3", "--deadline-ms", "500"]) == 0
        synthetic = capsys.readouterr().out.splitlines()
        assert cli_main([*target, "--model", "tiny_a", "--npy", str(tmp_path / "stack.npy")]) == 0
        npy = capsys.readouterr().out.splitlines()
        assert (
            cli_main([*target, "--model", "tiny_b", "--image", str(tmp_path / "frame.png"), "--capture-now"])
            == 0
        )
        image = capsys.readouterr().out.splitlines()
        assert cli_main([*target, "--model", "nope", "--synthetic", "1"]) == 1
        refused = capsys.readouterr().err
    assert [line.split()[1] for line in synthetic] == ["ok"] * 3
    assert len(npy) == 4 and all(" ok " in line and "class " in line for line in npy)
    assert len(image) == 1 and " ok " in image[0]
    assert "--model 'nope' is not served at" in refused
