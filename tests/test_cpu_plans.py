"""How `optimize_for_cpu_inference` chooses its plan (`seqbert.cpu_inference.plans`): the timing steps, the default
plan that stands where the timing cannot be trusted, the per-process cache (one timing at a time, a plan of its own for
each copy, hits said to be hits) and the CPU share against the process's cgroup CPU quota, on the real MiniLM weights.
Most tests set the timings (`FakeRounds`), so that they assert the procedure whatever the machine's load; the one that
times for real beside a busy process (marker `quiet_cpu`) skips where the machine is not quiet, as beside the other
workers of a parallel run, or held to an older instruction set: it runs on demand, `QUIET_CPU_COMMAND`, and
docs/testing.md records its last run."""

import dataclasses
import json
import logging
import os
import threading
import time
import warnings

import pytest
import torch
from conftest import BusyProcess, other_processes_cpu_share, timing_test

import seqbert
from seqbert import cpu_inference
from seqbert.cpu_inference import ROLES, capabilities, onednn_x86_operators_available, plans


# Where the same-plan timing test runs: in one process, on a quiet machine (docs/testing.md, "The same plan on a quiet
# CPU", records its last run). In a parallel run the other workers keep the CPU busy, so there it skips, naming this.
QUIET_CPU_COMMAND = "python -m pytest -n 0 -m quiet_cpu -rA tests/test_cpu_plans.py"
QUIET_CPU_RECORD = "docs/testing.md#the-same-plan-on-a-quiet-cpu"

needs_onednn = pytest.mark.skipif(
    not onednn_x86_operators_available(), reason="int8 needs torch's oneDNN operators on an x86 CPU"
)


def test_the_measured_plan_is_logged_reused_and_reproducible(minilm_path, tokenizer, rt_texts, caplog, monkeypatch):
    """`optimize_for_cpu_inference` times the candidates (`measure_plan`), logs its choice, attaches it to the copy,
    reuses the measurement for the same shapes and threads, and gives the same choice and bit-identical outputs when
    the plan is passed back, as an object or as JSON. Each copy holds a plan of its own, and a reused one says so, in
    its measurements and in the log."""
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    batch = dict(tokenizer(rt_texts[:16], padding=True, return_tensors="pt"))
    monkeypatch.setattr(plans, "_MEASURED_PLANS", {})  # measured here, not reused from another test
    with caplog.at_level(logging.INFO, logger="seqbert.cpu_inference"):
        fast = seqbert.optimize_for_cpu_inference(model, example_inputs=batch)
    plan = fast.cpu_inference_plan
    measured = plan.measurements
    assert measured["threads"] == torch.get_num_threads() and measured["sequences"] == 16
    assert measured["tokens"] == int(batch["attention_mask"].sum())
    assert set(measured["linear_ms"]) == set(ROLES)
    # The layers are timed unless the linear kernels' rounds already found the CPU contended (the default plan then)
    assert set(measured["layer_ms"]) == {"optimized", "eager"} or measured["chosen_by"].startswith("default plan: ")
    assert all(set(times) == set(cpu_inference.linear_kernels_available()) for times in measured["linear_ms"].values())
    assert measured["from_cache"] is False
    assert any(
        plan.summary() in record.getMessage() and "; measured in " in record.getMessage() for record in caplog.records
    )
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="seqbert.cpu_inference"):
        reused = seqbert.optimize_for_cpu_inference(model, example_inputs=batch).cpu_inference_plan
    assert reused == plan and reused.measurements["from_cache"] is True  # reused, and saying so ...
    assert [
        record.getMessage() for record in caplog.records if "reused from this process's cache" in record.getMessage()
    ]
    assert reused is not plan and reused.measurements is not measured  # ... in a plan of its own
    reused.measurements["linear_ms"].clear()
    assert measured["linear_ms"] and plans._MEASURED_PLANS[next(iter(plans._MEASURED_PLANS))].measurements["linear_ms"]
    pinned = seqbert.optimize_for_cpu_inference(model, plan=json.loads(json.dumps(plan.to_dict())))
    assert pinned.cpu_inference_plan == plan and pinned.cpu_inference_plan.measurements == measured
    assert pinned.cpu_inference_plan is not plan
    with torch.inference_mode():
        assert torch.equal(pinned(**batch).last_hidden_state, fast(**batch).last_hidden_state)


class FakeRounds:
    """A stand-in for `plans.time_rounds` that runs every candidate once (the real calls) and returns set timings,
    by step: `linear(role, kernel)`, `attention(option)` and `layer(name)` give milliseconds per round, `cpu_share`
    the share of its threads' time the process had on a core (`cores`: the cores it kept busy, instead), `sleep`
    seconds each call sleeps (another thread may then run)."""

    def __init__(self, linear, attention, layer, cpu_share=1.0, cores=None, sleep=0.0):
        self.linear, self.attention, self.layer, self.cpu_share = linear, attention, layer, cpu_share
        self.cores, self.sleep = cores, sleep

    def __call__(self, candidates, rounds, budget):
        for candidate in candidates.values():
            candidate()
        time.sleep(self.sleep)
        times = {}
        for name, candidate in candidates.items():
            if name in ("default", "measured", "eager") or name.startswith("groups/"):
                times[name] = self.layer(name)
            elif "/" in name:
                times[name] = self.attention(name)
            else:
                packed = candidate.func
                role = {3 * packed.in_features: "qkv", 4 * packed.in_features: "up_proj"}.get(packed.out_features)
                role = role or ("out_proj" if packed.in_features == packed.out_features else "down_proj")
                times[name] = self.linear(role, name)
        seconds = {name: 5 * sum(values) / 1000 for name, values in times.items()}
        cores = torch.get_num_threads() * self.cpu_share if self.cores is None else self.cores
        cpu = {name: wall * cores for name, wall in seconds.items()}
        return plans.TimedRounds(times, cpu, seconds)


def _rounds(milliseconds: float, spread: float = 0.0) -> list[float]:
    """Five rounds whose fastest is `milliseconds` and whose others lie `spread` above it."""
    return [milliseconds] + [milliseconds * (1 + spread)] * 4


def test_measure_plan_keeps_the_default_unless_clearly_faster_and_the_eager_layers_where_faster(
    minilm_path, tokenizer, rt_texts, monkeypatch
):
    """Each step keeps its fastest candidate (per role, the kernel 20 % faster for the query/key/value product and the
    one 5 % faster elsewhere; sdpa on 2 groups for attention); the plan so built replaces this CPU class's default
    plan only where its layer (with the length groups' construction shared by the encoder's layers) is more than
    `MARGIN` (10 %) faster; and in fp32 the eager layers stay unless the optimized ones are more than 10 % faster,
    bit-identical to the model."""
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    default = plans.default_plan()
    others = [kernel for kernel in cpu_inference.linear_kernels_available() if kernel != default.linear_kernels["qkv"]]

    def linear(role, kernel):
        if role == "qkv" and kernel == others[-1]:
            return _rounds(8.0)  # 20 % faster
        return _rounds(9.5 if kernel == others[0] else 10.0)  # 5 % faster: within the margin

    def attention(option):
        return _rounds(2.0 if option == "sdpa/2" else 10.0)

    def layer_times(measured, eager):
        times = {"default": 10.0, "measured": measured, "eager": eager}
        return lambda name: _rounds(times.get(name, 0.6))  # groups/...: the length groups, built once per forward

    monkeypatch.setattr(plans, "time_rounds", FakeRounds(linear, attention, layer_times(8.0, 8.0)))
    plan = plans.measure_plan(model.encoder.layers[0], lengths=[5, 9, 12], num_layers=6)
    assert plan.linear_kernels == {**dict.fromkeys(ROLES, others[0]), "qkv": others[-1]}
    assert (plan.attention, plan.length_groups, plan.eager_layers) == ("sdpa", 2, True)
    assert plan.measurements["chosen_by"] == "measurement"
    assert plan.measurements["layer_ms"] == {"optimized": pytest.approx(8.1), "eager": 8.0}  # + 0.6 ms / 6 layers
    fast = seqbert.optimize_for_cpu_inference(model, plan=plan)
    batch = dict(tokenizer(rt_texts[:8], padding=True, return_tensors="pt"))
    with torch.inference_mode():
        assert torch.equal(fast(**batch).last_hidden_state, model(**batch).last_hidden_state)
    # The measured layer only 6 % faster than the default plan's (10.0 against 10.6 ms, groups included): the
    # default's layers, optimized, where the eager layer is more than 10 % slower; at 5 % slower, the eager layers.
    for eager, eager_layers in ((11.8, False), (10.5, True)):
        monkeypatch.setattr(plans, "time_rounds", FakeRounds(linear, attention, layer_times(9.4, eager)))
        plan = plans.measure_plan(model.encoder.layers[0], lengths=[5, 9, 12])
        assert plan.same_layers(default) and plan.eager_layers == eager_layers


def test_rounds_that_disagree_run_the_default_plan_with_a_warning(minilm_path, monkeypatch):
    """Where the layer step's rounds spread beyond `MAX_SPREAD`, or the process had less than `MIN_CPU_SHARE` of its
    threads' time on a core, the timings are not trusted: the plan is this CPU class's default, whatever the timings
    favoured, and a warning gives the reason and how to pin a plan."""
    layer = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).encoder.layers[0]
    default = plans.default_plan()
    eager_faster = {"default": 10.0, "measured": 5.0, "eager": 2.0, "groups/default": 0.1, "groups/measured": 0.1}
    cases = {
        "spread": FakeRounds(
            lambda r, k: _rounds(10.0), lambda o: _rounds(10.0), lambda n: _rounds(eager_faster[n], 0.5)
        ),
        "share": FakeRounds(
            lambda r, k: _rounds(5.0 if k == "linear" else 10.0),
            lambda o: _rounds(10.0),
            lambda n: _rounds(eager_faster[n]),
            cpu_share=0.5,
        ),
    }
    for reason, fake in cases.items():
        monkeypatch.setattr(plans, "time_rounds", fake)
        with pytest.warns(UserWarning, match=r"timing rounds disagreed .* default plan of this CPU class .*plan=plan"):
            plan = plans.measure_plan(layer, lengths=[5, 9, 12])
        assert plan == default and plan.eager_layers == default.eager_layers, reason
        assert plan.measurements["chosen_by"].startswith("default plan: the timing rounds disagreed"), reason
        expected = "spread 50% above" if reason == "spread" else "had 50% of the CPU time its thread(s) could use"
        assert expected in plan.measurements["chosen_by"], reason


@needs_onednn
def test_int8_measured_slower_than_fp32_keeps_int8_and_warns_once_with_both_times(minilm_path, monkeypatch):
    """The precision is the caller's: where the fp32 eager layer measures faster than the int8 one, the plan still runs
    int8 layers (no eager layers), and one warning gives both times and what to do; a plan pinned with the eager
    layers for int8 is refused."""
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path)
    times = {"default": 10.0, "measured": 10.0, "eager": 8.0, "groups/default": 0.0, "groups/measured": 0.0}
    fake = FakeRounds(lambda r, k: _rounds(10.0), lambda o: _rounds(10.0), lambda n: _rounds(times[n]))
    monkeypatch.setattr(plans, "time_rounds", fake)
    monkeypatch.setattr(plans, "_MEASURED_PLANS", {})
    with pytest.warns(UserWarning, match=r"int8=True\) measured slower .*: 10.00 ms against 8.00 ms per encoder layer"):
        fast = seqbert.optimize_for_cpu_inference(model, int8=True)
    assert not fast.cpu_inference_plan.eager_layers
    assert type(fast.encoder.layers[0]).__name__.startswith("CpuOptimized")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seqbert.optimize_for_cpu_inference(model, int8=True)  # the measurement is reused: no second warning
    eager = dataclasses.replace(fast.cpu_inference_plan, eager_layers=True)
    with pytest.raises(ValueError, match=r"plan.eager_layers is True, which runs the fp32 eager layers, but int8"):
        seqbert.optimize_for_cpu_inference(model, int8=True, plan=eager)


@pytest.mark.quiet_cpu
@timing_test
def test_the_same_plan_on_a_quiet_cpu_and_beside_a_busy_process(minilm_path):
    """fp32 on the default timing batch: measured on a quiet machine, the plan is the measurement's (not the default
    that stands where the rounds disagree); measured again (not from the cache) while another process spins on one
    core, the plan is the same, measured or this class's default. Skips beside the other workers of a parallel run,
    and wherever other processes use the CPU around the quiet measurement (more than 10 % of it, from /proc/stat),
    naming where it runs instead: `QUIET_CPU_COMMAND`, on a quiet machine."""
    where = (
        f"it runs on demand, in one process on a quiet machine: `{QUIET_CPU_COMMAND}` (last run: {QUIET_CPU_RECORD})"
    )
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        pytest.skip(f"one of {workers} parallel workers, which keep the CPU busy; {where}")
    layer = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).encoder.layers[0]
    before = other_processes_cpu_share()
    if before is None:
        pytest.skip("reads the machine's load from Linux's /proc/stat")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quiet = plans.measure_plan(layer, num_layers=6)
    after = other_processes_cpu_share()
    if max(before, after) > 0.1:
        pytest.skip(
            f"the machine is not quiet: other processes took {before:.0%} and {after:.0%} of the CPU time around the "
            f"quiet measurement (chosen by {quiet.measurements['chosen_by']!r}); {where}"
        )
    assert quiet.measurements["chosen_by"] == "measurement", quiet.measurements
    with BusyProcess(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = plans.measure_plan(layer, num_layers=6)
    assert loaded == quiet, (quiet.measurements, loaded.measurements)
    # What docs/testing.md records of the run (shown by `-rA`).
    print(
        f"other processes {before:.0%} / {after:.0%} of the CPU around the quiet measurement; "
        f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, "
        f"{torch.get_num_threads()} threads\nquiet: {quiet.summary()}\nbeside a busy process "
        f"({loaded.measurements['chosen_by']}): {loaded.summary()}"
    )


def test_a_cached_plan_is_kept_apart_by_attn_implementation_and_training_mode(minilm_path, monkeypatch):
    """The cache key holds the attention implementation and the training mode: an eager-attention model is measured
    on the padded batch it runs (no length groups timed), an sdpa one on the unpadded batch, and each is reused only
    for its own; the eager layer is timed in eval mode whatever mode the model is in, which stays as it was. (Every
    candidate runs; the timings are set, so that a loaded machine cannot cut the timing short.)"""
    monkeypatch.setattr(plans, "_MEASURED_PLANS", {})
    uniform = FakeRounds(lambda role, kernel: _rounds(10.0), lambda option: _rounds(10.0), lambda name: _rounds(10.0))
    monkeypatch.setattr(plans, "time_rounds", uniform)
    models = {
        name: seqbert.SeqBertModel.from_bert_pretrained(minilm_path, attn_implementation=name).eval()
        for name in ("sdpa", "eager")
    }
    lengths = {"attention_mask": (torch.arange(12) < torch.tensor([12, 9, 5, 3])[:, None]).long()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = {
            name: seqbert.optimize_for_cpu_inference(model, example_inputs=lengths) for name, model in models.items()
        }
        assert not any(fast.cpu_inference_plan.measurements["from_cache"] for fast in found.values())
        for model in models.values():  # each reused for its own
            assert seqbert.optimize_for_cpu_inference(model, example_inputs=lengths).cpu_inference_plan.measurements[
                "from_cache"
            ]
        assert {name: fast.cpu_inference_plan.measurements["attn_implementation"] for name, fast in found.items()} == {
            "sdpa": "sdpa", "eager": "eager"
        }  # fmt: skip
        assert found["sdpa"].cpu_inference_plan.measurements["attention_ms"]
        assert not found["eager"].cpu_inference_plan.measurements["attention_ms"]
        modes = []
        training = models["sdpa"].train()
        training.encoder.layers[0].register_forward_pre_hook(lambda module, args: modes.append(module.training))
        trained = seqbert.optimize_for_cpu_inference(training, example_inputs=lengths).cpu_inference_plan
    assert not trained.measurements["from_cache"] and len(plans._MEASURED_PLANS) == 3
    assert modes and not any(modes)  # every timed call of the layer (eager and optimized copies) in eval mode
    assert training.training and training.encoder.layers[0].training


@pytest.mark.filterwarnings("ignore:optimize_for_cpu_inference")  # int8 may measure slower here: not the subject
def test_concurrent_calls_time_one_at_a_time(minilm_path, monkeypatch):
    """Two `optimize_for_cpu_inference` calls in two threads (two precisions: two plans to measure) time their
    candidates one after the other, never together: each timing step sleeps a little (another thread would run
    then), and at most one step is in progress at any time."""
    monkeypatch.setattr(plans, "_MEASURED_PLANS", {})
    model = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).eval()
    uniform = FakeRounds(lambda r, k: _rounds(10.0), lambda o: _rounds(10.0), lambda n: _rounds(10.0), sleep=0.05)
    in_progress, most, guard = [0], [0], threading.Lock()

    def counted(candidates, rounds, budget):
        with guard:
            in_progress[0] += 1
            most[0] = max(most[0], in_progress[0])
        try:
            return uniform(candidates, rounds, budget)
        finally:
            with guard:
                in_progress[0] -= 1

    monkeypatch.setattr(plans, "time_rounds", counted)
    kinds = [{}, {"int8": True}] if onednn_x86_operators_available() else [{}, {"example_inputs": _LENGTHS}]
    results, errors = {}, []

    def optimize(index, kind):
        try:
            results[index] = seqbert.optimize_for_cpu_inference(model, **kind).cpu_inference_plan
        except Exception as error:  # reported below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=optimize, args=(index, kind)) for index, kind in enumerate(kinds)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(results) == 2 and len(plans._MEASURED_PLANS) == 2
    assert most[0] == 1  # without the lock: 2
    assert all(plan.measurements["chosen_by"] == "measurement" for plan in results.values())


_LENGTHS = {"attention_mask": (torch.arange(12) < torch.tensor([12, 9, 5, 3])[:, None]).long()}


def test_the_cpu_share_is_taken_against_the_cgroup_cpu_quota(minilm_path, monkeypatch):
    """A process held by its cgroup to half a core, which its threads keep busy (half a core of CPU time per second),
    had all the CPU time it could use: the plan is measured, not the default. Without the quota in the count the
    share reads half a core over the threads, and the default plan stands with a warning that blames the load."""
    layer = seqbert.SeqBertModel.from_bert_pretrained(minilm_path).encoder.layers[0]
    fake = FakeRounds(lambda r, k: _rounds(10.0), lambda o: _rounds(10.0), lambda n: _rounds(10.0), cores=0.5)
    monkeypatch.setattr(plans, "time_rounds", fake)
    monkeypatch.setattr(capabilities, "cgroup_cpu_limit", lambda root="/": 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plan = plans.measure_plan(layer, lengths=[5, 9, 12])
    assert plan.measurements["chosen_by"] == "measurement" and plan.measurements["cpu_share"] == 1.0
    monkeypatch.setattr(capabilities, "cgroup_cpu_limit", lambda root="/": None)
    with pytest.warns(UserWarning, match=r"had \d+% of the CPU time its thread\(s\) could use"):
        plan = plans.measure_plan(layer, lengths=[5, 9, 12])
    assert plan.measurements["chosen_by"].startswith("default plan: the timing rounds disagreed")


def _cgroup_tree(root, mountinfo: str, cgroup: str, files: dict[str, str]) -> str:
    """A file system root holding `proc/self/mountinfo`, `proc/self/cgroup` and the cgroup files `files`, as Linux
    writes them."""
    for path, text in {"proc/self/mountinfo": mountinfo, "proc/self/cgroup": cgroup, **files}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return str(root)


def test_cgroup_cpu_limit_reads_v1_and_v2_and_the_tightest_ancestor(tmp_path):
    """`cgroup_cpu_limit` as the kernel documents the files: cgroup v2's `cpu.max` ("max" for none), cgroup v1's CFS
    quota and period (-1 for none), in the process's cgroup and its parents, the smallest quota binding; None where
    no quota is set. Lines from a real Docker container (v2, `--cpus=1.5`) and a systemd host in hybrid mode (v1)."""
    v2_mounts = "1136 1127 0:29 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw,nsdelegate\n"
    v2 = _cgroup_tree(tmp_path / "v2", v2_mounts, "0::/\n", {"sys/fs/cgroup/cpu.max": "150000 100000\n"})
    assert capabilities.cgroup_cpu_limit(v2) == 1.5
    nested = _cgroup_tree(
        tmp_path / "nested", v2_mounts, "0::/kubepods/pod1/app\n",
        {
            "sys/fs/cgroup/kubepods/cpu.max": "max 100000\n",
            "sys/fs/cgroup/kubepods/pod1/cpu.max": "50000 100000\n",  # the pod's limit binds its container
            "sys/fs/cgroup/kubepods/pod1/app/cpu.max": "200000 100000\n",
        },
    )  # fmt: skip
    assert capabilities.cgroup_cpu_limit(nested) == 0.5
    v1_mounts = (
        "35 25 0:30 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw\n"
        "40 25 0:35 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup "
        "rw,cpu,cpuacct\n"
    )
    v1 = _cgroup_tree(
        tmp_path / "v1", v1_mounts, "4:cpu,cpuacct:/user.slice\n0::/user.slice\n",
        {
            "sys/fs/cgroup/cpu,cpuacct/user.slice/cpu.cfs_quota_us": "200000\n",
            "sys/fs/cgroup/cpu,cpuacct/user.slice/cpu.cfs_period_us": "100000\n",
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        },
    )  # fmt: skip
    assert capabilities.cgroup_cpu_limit(v1) == 2.0
    unlimited = _cgroup_tree(tmp_path / "none", v2_mounts, "0::/\n", {"sys/fs/cgroup/cpu.max": "max 100000\n"})
    assert capabilities.cgroup_cpu_limit(unlimited) is None
    assert capabilities.cgroup_cpu_limit(str(tmp_path / "no_such_root")) is None
    usable = capabilities.usable_cpus()  # this machine, as it is
    assert 0 < usable <= torch.get_num_threads()
