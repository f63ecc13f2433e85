"""The reference side of tests/test_hub.py's comparison with `scripts/hub/load_without_seqbert.py`: the same `forward`
and `generate` jobs, run in a fresh process that imports the installed seqbert (its registered classes, no remote
code). Both processes start alike (same interpreter, torch, environment and thread count, nothing run before), so
they choose the same kernels and their outputs are comparable bit for bit on any CPU; the test process itself, after
hundreds of other tests, is not such a reference.

    python tests/seqbert_reference_outputs.py JOBS.json OUTPUT.safetensors
"""

import json
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file

import seqbert  # noqa: F401  (registers SeqBERT with the Auto classes)


def run(job) -> dict[str, torch.Tensor]:
    model = getattr(transformers, job["auto_class"]).from_pretrained(job["folder"]).eval()
    if not type(model).__module__.startswith("seqbert."):
        raise AssertionError(f"{type(model).__name__} came from {type(model).__module__}, not from seqbert")
    with torch.no_grad():
        if job["mode"] == "forward":
            output = model(**load_file(job["inputs"]))
            return {f"{job['name']}.{k}": v for k, v in output.items() if isinstance(v, torch.Tensor)}
        return {f"{job['name']}.sequences": model.generate(**load_file(job["inputs"]), **job["generate_kwargs"])}


def main(jobs_path: str, output_path: str) -> None:
    with open(jobs_path, encoding="utf-8") as f:
        jobs = [job for job in json.load(f) if job["mode"] in ("forward", "generate")]
    outputs = {}
    for job in jobs:
        outputs.update(run(job))
    save_file({key: value.contiguous() for key, value in outputs.items()}, output_path)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
