"""Parity with transformers: tiny random checkpoints and what transformers computes on them.

Run by hand (needs torch and transformers, which meshrt itself does not):

    pip install torch==2.13.0 transformers
    python bench/hf_parity.py            # (re)write the fixtures under test/data/hf/
    python bench/hf_parity.py --check    # compare meshrt's reference with them, print the table
    python bench/hf_parity.py --check --interpreter --seeds 5
                                         # and the interpreter on test32, 5 asynchrony seeds

Each fixture is a model of one supported type with transformers' own code
(`AutoModelForCausalLM.from_config`, eager attention, float32): 2 layers,
hidden 64, the type's features switched on (non-default rope_theta, rope
scaling, biases, q/k norm, norm_topk_prob true and false, mixed dense / MoE
layers, sliding windows, tied embeddings, explicit head_dim, eos null;
gpt_oss's sinks, router and expert biases, clamped SwiGLU, yarn and
alternating windows; Qwen3.5's Gated DeltaNet and gated full attention with
partial rotary, and its sigmoid-gated shared expert), and
parameters drawn at O(1) scale (norm gains 1 + N(0, 0.3²), biases N(0, 0.5²),
linear maps N(0, 1/fan_in), embeddings N(0, 1)) so that a forgotten bias,
gain or scaling changes the tokens (Qwen3.5's zero-centred RMSNorm weights
N(0, 0.3²), so that their gains 1 + w are as the others'). Each directory `test/data/hf/<name>/`
holds what `save_pretrained` writes (config.json, *.safetensors; one fixture
sharded with model.safetensors.index.json) and `expected.json` (prompts,
transformers' greedy tokens by full recomputation, no KV cache) plus
`logits.npy` (teacher-forced logits over prompt + generated tokens, every
position). `test/unit/test_hf_parity.py` checks them without torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "test" / "data" / "hf"
NEW_TOKENS = 16
PROMPT_LENS = (5, 8, 11)

BASE = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=8,
            num_key_value_heads=4, vocab_size=128, max_position_embeddings=32,
            eos_token_id=None, bos_token_id=None, pad_token_id=None)

# name -> (model_type, config overrides, save_pretrained options)
FIXTURES: dict[str, tuple[str, dict, dict]] = {
    "llama": ("llama", dict(
        rope_theta=5000.0, rms_norm_eps=1e-5, attention_bias=True, mlp_bias=True,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
        eos_token_id=7), {}),
    "qwen2": ("qwen2", dict(
        rope_theta=1e6, tie_word_embeddings=True, use_sliding_window=True, sliding_window=8,
        max_window_layers=1), {}),
    "qwen3": ("qwen3", dict(
        hidden_size=60, head_dim=12, rope_theta=1e6,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}),
        {}),
    "qwen3_moe": ("qwen3_moe", dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
        head_dim=8, rope_theta=20000.0, rope_scaling={"rope_type": "linear", "factor": 2.0}), {}),
    "qwen3_moe_mixed": ("qwen3_moe", dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=False,
        mlp_only_layers=[0], head_dim=8, attention_bias=True, rms_norm_eps=0.5),
        {"max_shard_size": "60KB"}),
    "mixtral": ("mixtral", dict(
        num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, sliding_window=8,
        rope_theta=3e5), {}),
    "gpt_oss": ("gpt_oss", dict(
        num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, head_dim=8,
        layer_types=["sliding_attention", "full_attention"], sliding_window=8, swiglu_limit=1.5,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                      "beta_fast": 16.0, "beta_slow": 1.0, "truncate": False}), {}),
    # Gated DeltaNet on layer 0, gated full attention (q/k norm, a quarter of head_dim
    # rotated) on layer 1; the MoE one with its sigmoid-gated shared expert
    "qwen3_5": ("qwen3_5_text", dict(
        head_dim=16, full_attention_interval=2, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=8, linear_value_head_dim=12, linear_conv_kernel_dim=3,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25}),
        {}),
    "qwen3_5_moe": ("qwen3_5_moe_text", dict(
        head_dim=16, layer_types=["linear_attention", "full_attention"], num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=24,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=8, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 5e4, "partial_rotary_factor": 0.5}),
        {}),
    # quantized checkpoints (QUANTIZED): transformers dequantizes them on the CPU
    "qwen3_fp8": ("qwen3", dict(head_dim=8, rope_theta=1e6), {}),
    "qwen3_moe_fp8": ("qwen3_moe", dict(
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
        head_dim=8), {}),
    "gpt_oss_mxfp4": ("gpt_oss", dict(
        num_local_experts=4, num_experts_per_tok=2, intermediate_size=32, head_dim=8,
        num_key_value_heads=8,
        layer_types=["sliding_attention", "full_attention"], sliding_window=8, swiglu_limit=1.5), {}),
}

# fixture -> its quantization_config: fp8 every linear layer but lm_head (e4m3, a float32
# scale per 32 x 32 block), mxfp4 gpt_oss's experts; the other tensors in bfloat16, as the
# published checkpoints store them (transformers computes in float32 from their values)
QUANTIZED: dict[str, dict] = {
    "qwen3_fp8": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                  "weight_block_size": [32, 32], "modules_to_not_convert": ["lm_head"]},
    "qwen3_moe_fp8": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                      "weight_block_size": [32, 32], "modules_to_not_convert": ["lm_head"]},
    "gpt_oss_mxfp4": {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]},
}


# -- making the fixtures (torch) ----------------------------------------------------

def _o1_init(model, seed: int) -> None:
    """Parameters at O(1) scale: biases and gains matter (see the module doc)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    zero_centred = "qwen3_5" in type(model).__name__.lower()  # its RMSNorms scale by 1 + weight
    with torch.no_grad():
        for name, p in model.named_parameters():
            if zero_centred and p.ndim == 1 and name.endswith("norm.weight") \
                    and "linear_attn" not in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:  # RMSNorm gains
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:  # (out, in) linear maps, fused experts (E, out, in), gpt_oss's (E, in, out)
                fan_in = p.shape[-2] if "experts" in name and "gpt_oss" in type(model).__name__.lower() \
                    else p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)


def _greedy(model, prompt: list[int], eos: int | None) -> list[int]:
    """Greedy tokens by recomputing the whole sequence each step (no KV cache)."""
    import torch

    ids = list(prompt)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(torch.tensor([ids])).logits[0, -1]
            tok = int(torch.argmax(logits))
            out.append(tok)
            ids.append(tok)
            if eos is not None and tok == eos:
                break
    return out


def make(name: str, seed: int) -> dict:
    import torch
    import transformers

    mt, over, save = FIXTURES[name]
    cfg = transformers.AutoConfig.for_model(mt, **{**BASE, **over})
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    _o1_init(model, seed)
    if getattr(cfg, "tie_word_embeddings", False):
        model.tie_weights()
    model.eval()
    d = OUT / name
    shutil.rmtree(d, ignore_errors=True)
    model.save_pretrained(d, **save)
    (d / "generation_config.json").unlink(missing_ok=True)
    if name in QUANTIZED:  # the same weights stored quantized; transformers reads them back
        _quantize_checkpoint(d, QUANTIZED[name])
        model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
        model.config._attn_implementation = "eager"
        model.eval()
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, cfg.vocab_size, n).tolist() for n in PROMPT_LENS]
    eos = over.get("eos_token_id", BASE["eos_token_id"])
    tokens = [_greedy(model, p, eos) for p in prompts]
    logits = []
    with torch.no_grad():
        for p, t in zip(prompts, tokens):
            seq = p + t[:-1]
            logits.append(model(torch.tensor([seq])).logits[0].numpy().astype(np.float32))
    np.save(d / "logits.npy", np.concatenate(logits))
    exp = {"model_type": mt.removesuffix("_text"), "transformers": transformers.__version__, "torch": torch.__version__,
           "seed": seed, "prompts": prompts, "tokens": tokens, "eos": eos}
    (d / "expected.json").write_text(json.dumps(exp, indent=1) + "\n")
    return exp


def _quantize_checkpoint(d: Path, qcfg: dict) -> None:
    """Rewrite checkpoint `d` with its quantized weights stored as transformers reads them:
    fp8 `weight` (float8_e4m3fn) + `weight_scale_inv` (float32 block grid), mxfp4
    `*_blocks` (uint8, two E2M1 codes a byte, even element low) + `*_scales` (E8M0)."""
    import torch
    from safetensors.torch import load_file, save_file

    from meshrt import quant

    fmt = qcfg["quant_method"]
    saved = {}  # the hub's tensor names, as save_pretrained wrote them
    for f in sorted(d.glob("*.safetensors")):
        saved |= load_file(str(f))
    out = {}
    for name, p in saved.items():
        a = p.detach().float().numpy()
        if fmt == "fp8" and name.endswith(".weight") and a.ndim == 2 and (
                "self_attn" in name or ".mlp." in name) and "norm" not in name and "gate.weight" not in name:
            bo, bi = qcfg["weight_block_size"]
            q = quant.pack(a.T, "fp8", (bi, bo))  # meshrt's (in, out) orientation
            out[name] = torch.from_numpy(q.codes.T.copy()).view(torch.float8_e4m3fn)
            grid = q.scales[:, ::bo].T  # (out blocks, in blocks): one per block, not per column
            out[name.removesuffix(".weight") + ".weight_scale_inv"] = torch.from_numpy(grid.copy())
        elif fmt == "mxfp4" and name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            q = quant.pack(a, "mxfp4")  # gpt_oss keeps experts as (E, in, out)
            codes = np.swapaxes(q.codes, -1, -2)  # (E, out, in)
            e, n_out, n_in = codes.shape
            blocks = codes.reshape(e, n_out, n_in // 32, 16, 2)
            out[name + "_blocks"] = torch.from_numpy((blocks[..., 0] | (blocks[..., 1] << 4)).copy())
            out[name + "_scales"] = torch.from_numpy(np.swapaxes(q.scales, -1, -2).copy())
        else:
            out[name] = p.detach().to(torch.bfloat16).contiguous()
    for f in d.glob("*.safetensors"):
        f.unlink()
    save_file(out, str(d / "model.safetensors"), metadata={"format": "pt"})
    # a sharded index from save_pretrained would name the files just removed
    (d / "model.safetensors.index.json").unlink(missing_ok=True)
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = qcfg
    cfg["dtype"] = "bfloat16"
    cfg.pop("torch_dtype", None)
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


# -- checking meshrt against them (no torch) ----------------------------------------

def reference_outputs(d: Path):
    """(model, greedy tokens per prompt, teacher-forced logits (rows, vocab)) of meshrt's
    NumPy reference on fixture directory `d`, loaded through `meshrt run`'s path."""
    from meshrt import driver
    from meshrt.runtime import reference as ref
    from meshrt.runtime.checkpoint import load_checkpoint

    exp = json.loads((d / "expected.json").read_text())
    # transformers ran in float32, also the fixtures stored in bfloat16
    shape = dataclasses.replace(ref.RefShape.of(driver.load_spec(d).shape), act_format="f32")
    model = ref.ReferenceModel(shape, load_checkpoint(d, shape))
    tokens = [model.generate(p, NEW_TOKENS) for p in exp["prompts"]]
    rows = []
    for p, t in zip(exp["prompts"], exp["tokens"]):
        st = model.new_state()
        for tok in p + t[:-1]:  # one token at a time: the logits at every position
            rows.append(model.forward([(st, [tok])])[0])
    return model, tokens, np.stack(rows)


def f32_activations(module):
    """Graph IR `module` with fp32 activations, as transformers computed the fixtures (a
    fixture stored in bfloat16 would otherwise move and round its activations as bf16)."""
    from xdsl.dialects.builtin import DictionaryAttr, StringAttr

    from meshrt import driver

    program = driver.program_of(module)
    program.hparams = DictionaryAttr({**program.hparams.data, "act_format": StringAttr("f32")})
    return module


def interpreter_tokens(d: Path, seed: int, target: str = "test32"):
    """The interpreter's outputs on `target` for the fixture's prompts (the
    serving loop also checks them against the reference): (tokens per prompt, result)."""
    from meshrt import driver
    from meshrt.runtime.checkpoint import load_checkpoint
    from meshrt.runtime.serving import reference_shape, serve
    from meshrt.runtime.workloads import Request

    exp = json.loads((d / "expected.json").read_text())
    program = driver.segment_program(f32_activations(driver.compile(d, target, "graph")), target)
    weights = load_checkpoint(d, reference_shape(program))
    reqs = [Request(i, 0.0, list(p), len(p), NEW_TOKENS, NEW_TOKENS)
            for i, p in enumerate(exp["prompts"])]
    res = serve(program, driver.load_target(target), reqs, seed=seed, weights=weights)
    by_id = {r.id: r.tokens for r in res.records}
    return [by_id.get(i) for i in range(len(reqs))], res


def check(names: list[str], interpreter: bool, seeds: int) -> int:
    rows, bad = [], 0
    for name in names:
        d = OUT / name
        exp = json.loads((d / "expected.json").read_text())
        _, toks, logits = reference_outputs(d)
        want = np.load(d / "logits.npy")
        total = sum(len(t) for t in exp["tokens"])
        same = sum(a == b for x, y in zip(toks, exp["tokens"]) for a, b in zip(x, y))
        same -= sum(abs(len(x) - len(y)) for x, y in zip(toks, exp["tokens"]))
        err = float(np.max(np.abs(logits - want)))
        row = [name, f"{same}/{total}", f"{err:.2e}"]
        ok = same == total and err <= 1e-4
        if interpreter:
            t0, matched = time.time(), 0
            for s in range(seeds):
                got, res = interpreter_tokens(d, s)
                matched += got == toks and res.outputs_match_reference
            row.append(f"{matched}/{seeds} seeds ({time.time() - t0:.0f} s)")
            ok &= matched == seeds
        bad += not ok
        rows.append(row)
    head = ["fixture", "tokens = transformers", "max |logit error|"] + (
        ["interpreter tokens = reference (test32)"] if interpreter else [])
    print(" | ".join(head))
    for r in rows:
        print(" | ".join(r))
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"fixtures (default all: {', '.join(FIXTURES)})")
    ap.add_argument("--check", action="store_true", help="compare meshrt with the fixtures")
    ap.add_argument("--interpreter", action="store_true", help="with --check: the interpreter too")
    ap.add_argument("--seeds", type=int, default=5, help="asynchrony seeds for --interpreter")
    ap.add_argument("--seed", type=int, default=0, help="seed of the fixtures' weights and prompts")
    args = ap.parse_args(argv)
    names = args.names or list(FIXTURES)
    unknown = [n for n in names if n not in FIXTURES]
    if unknown:
        ap.error(f"unknown fixture {unknown[0]}; known: {', '.join(FIXTURES)}")
    if args.check:
        return check(names, args.interpreter, args.seeds)
    for n in names:
        exp = make(n, args.seed)
        size = sum(f.stat().st_size for f in (OUT / n).iterdir())
        print(f"{n}: {exp['model_type']}, {size / 1024:.0f} KB, tokens {exp['tokens'][0][:6]}...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
