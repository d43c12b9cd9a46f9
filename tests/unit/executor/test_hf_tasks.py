"""Hugging Face ``transformers`` models as tasks (``hf:<architecture>[-<size>]``): the
profile counted from the model (parameters exactly, FLOPs against ``torch``'s own
counter), the tensor-parallel plans, the API's acceptance, and the tiny models training
20 steps under dp2 + top-k, tp2, pp2 and bf16 with the loss going down."""

from __future__ import annotations

import statistics

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from autotune.catalog.hf import SIZES, hf_profile, parse_hf_name
from autotune.catalog.tasks import resolve_task
from autotune.core import CompressionSpec, JobConfig, Layout, PrecisionMap
from autotune.executor.hf import HFTask, HFTransformer
from autotune.executor.local import run_local
from autotune.executor.tasks import TaskError, load_task
from autotune.executor.worker import WorkerSpec

TINY = ("hf:gpt2-tiny", "hf:llama-tiny", "hf:bert-tiny")
EVERY = [f"hf:{arch}-{size}" for arch, spec in SIZES.items() for size in spec.sizes]


def _counted_flops(task: HFTask) -> int:
    """Forward and backward of one sample on ``meta``, counted by ``FlopCounterMode``
    (attention through the math kernel: the fused CPU kernel is not counted)."""
    with torch.device("meta"):
        model = task.build_model()
        inputs = torch.randint(0, 256, (1, task.context))
    targets = inputs.clone()
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        task.loss(model, (inputs, targets)).backward()
    return int(counter.get_total_flops())


@pytest.mark.parametrize("name", EVERY)
def test_the_catalog_profile_counts_the_models_parameters_and_flops(name: str) -> None:
    """The profile the catalog counts from the configuration against the model the
    executor builds, every size on meta: llama-7b's billions cost nothing."""
    task = HFTask(name)
    with torch.device("meta"):
        model = task.build_model()
    profile = hf_profile(name)
    assert profile.parameters == sum(p.numel() for p in model.parameters())
    assert profile.num_layers == task.layers == len(model.blocks)
    assert profile.seq_len == task.context
    counted = _counted_flops(task)
    assert profile.flops_per_sample == pytest.approx(counted, rel=0.01)


def test_published_sizes_have_their_published_parameter_counts() -> None:
    """Untied heads: GPT-2 small's 124 M plus its 38.6 M head; Llama 2 7B exactly."""
    assert hf_profile("hf:llama-7b").parameters == 6_738_415_616
    assert hf_profile("hf:gpt2").parameters == 124_439_808 + 50_257 * 768
    assert hf_profile("hf:bert-base").parameters > 110_000_000


def test_names_and_sizes() -> None:
    assert parse_hf_name("hf:gpt2") == ("gpt2", "small")
    assert parse_hf_name("hf:llama") == ("llama", "1b")
    assert parse_hf_name("hf:bert-large") == ("bert", "large")
    with pytest.raises(ValueError, match=r"no size 'huge' of gpt2 \(sizes: tiny, small"):
        parse_hf_name("hf:gpt2-huge")
    with pytest.raises(ValueError, match=r"not a Hugging Face task .*hf:llama\[-tiny\|1b\|7b\]"):
        parse_hf_name("hf:t5")
    with pytest.raises(TaskError, match="no size"):
        load_task("hf:llama-3b")


def test_the_api_takes_hf_tasks_with_their_profile_and_says_what_to_install() -> None:
    task = resolve_task("hf:llama-tiny", [], trains=True)
    assert task.model == hf_profile("hf:llama-tiny")
    assert resolve_task("hf:llama-1b", [], trains=True).model == hf_profile("hf:llama-1b")
    # 25 GiB of fp32 weights, built whole on a rank: only a simulated backend takes it.
    assert resolve_task("hf:llama-7b", [], trains=False).model == hf_profile("hf:llama-7b")
    with pytest.raises(ValueError, match=r"simulated only: .* 25 GiB of weights, above the 8"):
        resolve_task("hf:llama-7b", [], trains=True)
    with pytest.raises(ValueError, match="no size"):
        resolve_task("hf:llama-3b", [], trains=True)


def test_without_transformers_naming_a_hf_task_says_which_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import builtins

    real_import = builtins.__import__

    def no_transformers(name: str, *args: object, **kwargs: object) -> object:
        if name == "transformers" or name.startswith("transformers."):
            raise ImportError("No module named 'transformers'")
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_transformers)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a, **k: None)
    with pytest.raises(ValueError, match=r"pip install 'autotune\[hf\]'"):
        resolve_task("hf:gpt2-tiny", [], trains=True)
    with pytest.raises(TaskError, match=r"pip install 'autotune\[hf\]'"):
        load_task("hf:gpt2-tiny")


def test_tensor_parallel_plans() -> None:
    """Llama's is the plan transformers ships; BERT pairs attention and MLP; GPT-2's
    fused q/k/v projection stays whole, its MLP is sharded."""
    plans = {name: HFTask(name).tp_plan() for name in TINY}
    llama = {k.removeprefix("blocks.0.layer."): v for k, v in plans["hf:llama-tiny"].items()}
    assert {k: v for k, v in llama.items() if not k.startswith("blocks.")} == {
        "self_attn.q_proj": "colwise",
        "self_attn.k_proj": "colwise",
        "self_attn.v_proj": "colwise",
        "self_attn.o_proj": "rowwise",
        "mlp.gate_proj": "colwise",
        "mlp.up_proj": "colwise",
        "mlp.down_proj": "rowwise",
    }
    assert plans["hf:bert-tiny"]["blocks.1.layer.attention.output.dense"] == "rowwise"
    assert len(plans["hf:bert-tiny"]) == 6 * 2
    assert plans["hf:gpt2-tiny"] == {
        f"blocks.{i}.layer.mlp.{name}": style
        for i in range(2)
        for name, style in (("c_fc", "colwise"), ("c_proj", "rowwise"))
    }


def test_gpt2s_conv1d_becomes_the_linear_it_computes() -> None:
    """The wrapped GPT-2 gives the logits of transformers' own model on the same
    weights."""
    import transformers

    torch.manual_seed(0)
    task = HFTask("hf:gpt2-tiny")
    model = task.build_model()
    assert isinstance(model, HFTransformer)
    assert not any(type(m).__name__ == "Conv1D" for m in model.modules())
    config = transformers.GPT2Config(
        vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=64, tie_word_embeddings=False
    )
    reference = transformers.GPT2LMHeadModel(config).eval()
    blocks = list(model.blocks)
    with torch.no_grad():
        reference.transformer.wte.weight.copy_(model.embed.wte.weight)
        reference.transformer.wpe.weight.copy_(model.embed.wpe.weight)
        reference.lm_head.weight.copy_(model.lm_head.weight)
        for ours, theirs in zip(blocks, reference.transformer.h, strict=True):
            for name in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
                linear = ours.layer.get_submodule(name)
                conv = theirs.get_submodule(name)
                conv.weight.copy_(linear.weight.t())
                conv.bias.copy_(linear.bias)
    inputs, _ = next(task.batches(0, 1, seed=0))
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(inputs), reference(inputs).logits)


BF16 = PrecisionMap(
    embedding="bf16", attention_qkv="bf16", attention_out="bf16", ffn="bf16", head="bf16"
)
LAYOUTS = {
    "dp2-topk": JobConfig(
        layout=Layout(world_size=2, dp=2), compression=CompressionSpec(kind="topk", ratio=0.1)
    ),
    "tp2": JobConfig(layout=Layout(world_size=2, dp=1, tp=2)),
    "pp2": JobConfig(layout=Layout(world_size=2, dp=1, pp=2, micro_batches=2)),
    "bf16": JobConfig(layout=Layout(world_size=1, dp=1), precision=BF16),
}


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", TINY)
def test_a_tiny_model_trains_20_steps(name: str, layout: str) -> None:
    spec = WorkerSpec(task=name, config=LAYOUTS[layout], seed=0, batch_size=16)
    losses = run_local(spec, 20, save=False).losses()
    assert len(losses) == 20
    assert statistics.mean(losses[-5:]) < statistics.mean(losses[:5]) - 1.0, losses
