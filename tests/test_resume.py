"""Training runs of the example scripts resume the way users restart them: the same command after a `kill -9`, with
`--resume_from_checkpoint PATH`, with `--resume_from_checkpoint True` (or `latest`), or with no flag at all, resumes
from the newest complete checkpoint in `--output_dir` and says so in one log line; `--overwrite_output_dir` starts
over (see `seqbert.script_utils.resume_point`).

The kill test runs the real `run_classification.py` as a user would: an uninterrupted reference run, one run killed
with SIGKILL once its first checkpoint exists, and that run restarted with the same command, which must end with
weights bit-identical to the reference. Every flag form of every script differs from that restart only in the
checkpoint and reason its argument checking (`parse_and_check`, `resume_point`) returns, then shares the same code
(`train_and_save`): those are tested in-process on each flag form, which takes milliseconds, rather than with one
more restart (13 s each) per form."""

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import run_classification  # noqa: E402
import run_mlm  # noqa: E402
import run_seq2seq  # noqa: E402
import torch
from conftest import ROOT, SCRIPT_PATHS, tiny_config
from safetensors.torch import load_file
from transformers import TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

import seqbert
from seqbert.script_utils import RUN_OUTPUT_FILES, ResumePoint, ScriptInputError
from seqbert.training import STAGING_DIR, SeqBertTrainer


# The small-data arguments of conftest's `classification_run` (96 training snippets: 3 steps of 32, one epoch), with a
# checkpoint after every step (only the newest kept, so each save also rotates the previous one out) and no evaluation,
# which the final weights do not depend on.
CLASSIFICATION_ARGS = (
    "--max_train_samples", "96", "--max_eval_samples", "64", "--num_train_epochs", "1", "--logging_steps", "1",
    "--save_strategy", "steps", "--save_steps", "1", "--save_total_limit", "1", "--no_do_eval", "--eval_strategy", "no",
)  # fmt: skip
STEPS = 3
RESUME_LINE = "Resuming training from checkpoint "


def script_command(output_dir: Path, *args: str) -> list[str]:
    return [sys.executable, str(SCRIPT_PATHS["run_classification.py"]), "--output_dir", str(output_dir), *args]


ENV = dict(os.environ, HF_HUB_OFFLINE="1")


def run_classification_script(output_dir: Path, *args: str) -> str:
    """Run `run_classification.py` with `CLASSIFICATION_ARGS` and `args`, assert it succeeded; return its output."""
    command = script_command(output_dir, *CLASSIFICATION_ARGS, *args)
    result = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout + result.stderr


def resume_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if RESUME_LINE in line]


@pytest.fixture(scope="module")
def reference_weights(tmp_path_factory) -> dict[str, torch.Tensor]:
    """The final weights of an uninterrupted run."""
    output_dir = tmp_path_factory.mktemp("reference") / "run"
    output = run_classification_script(output_dir)
    assert resume_lines(output) == []
    return load_file(output_dir / "model.safetensors")


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory) -> Path:
    """The output folder of a run killed with SIGKILL as soon as its first checkpoint appeared, while it went on
    training: with one step of the three done, the kill lands in a later step, a checkpoint save or a rotation."""
    output_dir = tmp_path_factory.mktemp("killed") / "run"
    command = script_command(output_dir, *CLASSIFICATION_ARGS)
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV, cwd=ROOT)
    try:
        deadline = time.monotonic() + 600
        while process.poll() is None and time.monotonic() < deadline:
            if output_dir.is_dir() and get_last_checkpoint(output_dir) is not None:
                break
            time.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == -signal.SIGKILL, (
        f"the run ended on its own (status {process.returncode}):\n" + (stderr.decode()[-3000:])
    )
    assert not (output_dir / "model.safetensors").exists()  # killed before the end of training
    assert get_last_checkpoint(output_dir) is not None
    return output_dir


def test_a_killed_run_restarted_ends_bit_identical_to_an_uninterrupted_one(killed_run, reference_weights, tmp_path):
    """Restarted with the same command, the killed run resumes from its newest checkpoint, logs that once and ends at
    step 3 with the reference weights. (`--resume_from_checkpoint PATH` and `True` resume from the same checkpoint:
    `test_each_flag_form_resumes_from_the_newest_complete_checkpoint`.)

    Where the kill lands varies from run to run (after step 1's checkpoint: in step 2, in saving or rotating a
    checkpoint), and the outcome does not depend on it: checkpoints appear by one rename once complete and disappear
    by one rename before they are deleted, so the newest `checkpoint-N` is complete whatever the moment; a checkpoint
    holds the weights, the optimizer, the scheduler and the RNG states, so training resumed from step N replays
    steps N+1.. exactly as the uninterrupted run took them. Any kill point therefore leads to the same final weights,
    and the assertions below hold for all of them."""
    output_dir = tmp_path / "run"
    shutil.copytree(killed_run, output_dir)  # the killed run's folder stays as it was left
    checkpoint = get_last_checkpoint(output_dir)
    output = run_classification_script(output_dir)

    lines = resume_lines(output)
    assert len(lines) == 1, output[-3000:]
    assert f"{RESUME_LINE}{checkpoint}: " in lines[0] and "found in output_dir" in lines[0], lines[0]
    assert get_last_checkpoint(output_dir) == str(output_dir / f"checkpoint-{STEPS}")
    assert not (output_dir / STAGING_DIR).exists()

    resumed = load_file(output_dir / "model.safetensors")
    assert resumed.keys() == reference_weights.keys()
    for name, value in reference_weights.items():
        assert torch.equal(resumed[name], value), name


# In-process: every script's `parse_and_check` on each way of restarting. Checkpoints here are folders with a
# `trainer_state.json`, which is what marks a checkpoint complete (Trainer writes it last).

SCRIPTS = {"classification": run_classification, "seq2seq": run_seq2seq, "mlm": run_mlm}


def make_checkpoint(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text("{}")
    return folder


@pytest.fixture
def output_dir(tmp_path) -> Path:
    """An interrupted run's folder: checkpoints 2 and 10 (10 is newer: steps count, not names), a checkpoint being
    assembled in the staging folder (incomplete, never to be picked) and a file of the user's."""
    folder = tmp_path / "run"
    make_checkpoint(folder / "checkpoint-2")
    make_checkpoint(folder / "checkpoint-10")
    (folder / STAGING_DIR / "checkpoint-12").mkdir(parents=True)
    (folder / "notes.txt").write_text("mine")
    return folder


def check(script: str, output_dir: Path, *args: str) -> ResumePoint:
    """`parse_and_check` of `script`; checks that what it returns agrees with `resume_from_checkpoint`."""
    parsed = SCRIPTS[script].parse_and_check(["--output_dir", str(output_dir), *args])
    training_args, start = parsed[2], parsed[-1]
    assert training_args.resume_from_checkpoint == start.checkpoint
    return start


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize(
    ("args", "why"),
    [
        (("--resume_from_checkpoint", "{dir}/checkpoint-10"), "given by --resume_from_checkpoint"),
        (("--resume_from_checkpoint", "True"), "as --resume_from_checkpoint True asks"),
        (("--resume_from_checkpoint", "latest"), "as --resume_from_checkpoint latest asks"),
        ((), "found in output_dir"),
    ],
)
def test_each_flag_form_resumes_from_the_newest_complete_checkpoint(script, args, why, output_dir):
    start = check(script, output_dir, *(arg.format(dir=output_dir) for arg in args))
    assert start.checkpoint == str(output_dir / "checkpoint-10") and not start.start_over
    assert start.message == f"{RESUME_LINE}{output_dir / 'checkpoint-10'}: {start.reason}" and why in start.reason
    assert "\n" not in start.message


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_older_checkpoint_can_be_named_and_overwrite_output_dir_starts_over(script, output_dir):
    assert check(script, output_dir, "--resume_from_checkpoint", str(output_dir / "checkpoint-2")).checkpoint == str(
        output_dir / "checkpoint-2"
    )
    start = check(script, output_dir, "--overwrite_output_dir")
    assert start.checkpoint is None and start.start_over


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_new_or_empty_output_dir_or_one_without_run_outputs_starts_a_new_run(script, tmp_path):
    assert check(script, tmp_path / "new").checkpoint is None
    assert check(script, tmp_path).checkpoint is None  # exists, empty
    # A run killed before its first checkpoint was renamed into place, and a file that is not a run's output.
    make_checkpoint(tmp_path / STAGING_DIR / "checkpoint-1")
    (tmp_path / "notes.txt").write_text("mine")
    start = check(script, tmp_path)
    assert start.checkpoint is None and not start.start_over
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    ("script", "make", "args", "names"),
    [
        ("classification", None, ("--resume_from_checkpoint", "True"), ["resume_from_checkpoint", "'True'", "no checkpoint"]),
        ("seq2seq", None, ("--resume_from_checkpoint", "LATEST"), ["resume_from_checkpoint", "'LATEST'"]),
        ("mlm", None, ("--resume_from_checkpoint", "{dir}/nope"), ["resume_from_checkpoint", "does not exist"]),
        ("classification", "notes.txt", ("--resume_from_checkpoint", "{dir}/notes.txt"), ["resume_from_checkpoint", "is not a folder"]),
        ("seq2seq", "checkpoint-3/model.safetensors", ("--resume_from_checkpoint", "{dir}/checkpoint-3"), ["resume_from_checkpoint", "trainer_state.json"]),
        ("mlm", f"{STAGING_DIR}/checkpoint-3/trainer_state.json", ("--resume_from_checkpoint", f"{{dir}}/{STAGING_DIR}/checkpoint-3"), ["resume_from_checkpoint", STAGING_DIR]),
        # The newest checkpoint is incomplete (left by another program): refused, not resumed from, not skipped.
        ("classification", "checkpoint-3/model.safetensors", (), ["newest checkpoint", "checkpoint-3", "trainer_state.json"]),
        *[("seq2seq", name, (), ["output_dir", name, "--overwrite_output_dir"]) for name in RUN_OUTPUT_FILES],
        ("mlm", "checkpoint-1/trainer_state.json", ("--resume_from_checkpoint", "True", "--overwrite_output_dir"), ["resume_from_checkpoint", "overwrite_output_dir"]),
        ("classification", "checkpoint-1/trainer_state.json", ("--resume_from_checkpoint", "True", "--do_train", "False"), ["resume_from_checkpoint", "do_train"]),
    ],
)  # fmt: skip
def test_a_checkpoint_that_cannot_be_resumed_from_is_a_one_line_error_naming_the_argument(
    script, make, args, names, tmp_path
):
    if make is not None:
        (tmp_path / make).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / make).write_text("{}")
    before = sorted(str(path) for path in tmp_path.rglob("*"))
    with pytest.raises(ScriptInputError) as error:
        check(script, tmp_path, *(arg.format(dir=tmp_path) for arg in args))
    message = str(error.value)
    assert "\n" not in message and all(name in message for name in names), message
    assert sorted(str(path) for path in tmp_path.rglob("*")) == before  # nothing written


def test_output_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ScriptInputError, match=r"output_dir \('.*file'\) is a file"):
        check("classification", tmp_path / "file")


def tiny_trainer(output_dir: Path, **kwargs) -> SeqBertTrainer:
    model = seqbert.SeqBertForSequenceClassification(tiny_config())
    args = TrainingArguments(output_dir=str(output_dir), report_to="none", use_cpu=True, **kwargs)
    return SeqBertTrainer(model=model, args=args)


def test_remove_checkpoints_removes_every_checkpoint_and_nothing_else(tmp_path):
    for step in (1, 5, 12):
        make_checkpoint(tmp_path / f"checkpoint-{step}")
    (tmp_path / "notes.txt").write_text("mine")
    removed = tiny_trainer(tmp_path).remove_checkpoints()
    assert sorted(removed) == ["checkpoint-1", "checkpoint-12", "checkpoint-5"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["notes.txt"]


def test_a_checkpoint_saved_again_or_rotated_out_goes_by_rename(tmp_path, monkeypatch):
    """A checkpoint saved again at its step replaces the old one whole, and `save_total_limit` drops the oldest;
    both move the old folders into the staging folder before deleting them, so no partial `checkpoint-N` exists at
    any moment."""
    trainer = tiny_trainer(tmp_path, save_total_limit=1, save_only_model=True)
    make_checkpoint(tmp_path / "checkpoint-1")
    make_checkpoint(tmp_path / "checkpoint-3")
    (tmp_path / "checkpoint-3" / "stale.txt").write_text("from an earlier run")
    renames = []
    replace = os.replace

    def recording_replace(source, destination):
        renames.append((os.path.relpath(source, tmp_path), os.path.relpath(destination, tmp_path)))
        replace(source, destination)

    monkeypatch.setattr(os, "replace", recording_replace)
    trainer.state.global_step = 3
    trainer._save_checkpoint(trainer.model, trial=None)
    monkeypatch.undo()

    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint-3"]
    saved = {path.name for path in (tmp_path / "checkpoint-3").iterdir()}
    assert {"model.safetensors", "trainer_state.json"} <= saved and "stale.txt" not in saved
    into_place = [i for i, (_, destination) in enumerate(renames) if destination in ("checkpoint-1", "checkpoint-3")]
    out_of_place = {source: i for i, (source, destination) in enumerate(renames) if destination.startswith(STAGING_DIR)}
    assert [renames[i] for i in into_place] == [(f"{STAGING_DIR}/checkpoint-3", "checkpoint-3")]
    assert out_of_place.keys() == {"checkpoint-1", "checkpoint-3"}
    assert out_of_place["checkpoint-3"] < into_place[0] < out_of_place["checkpoint-1"]
