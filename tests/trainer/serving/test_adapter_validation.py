"""Publishing validates an adapter from its tensors, not only its config: every bad adapter an
adversarial run published (issue 14, item 12) and the other ways a file can lie are refused
with a PublishError naming the file and the problem, never an AttributeError, KeyError or
TypeError. Adapters are written byte by byte (``tests/lora_files.py``): no torch, no training.
"""

from __future__ import annotations

import json
import random
import re

import pytest

from agl_bridge.trainer.serving.publisher import PublishError, validate_adapter
from tests.lora_files import (
    HIDDEN,
    MODULES,
    header_of,
    lora_tensors,
    safetensors_bytes,
    write_adapter,
)

MAX_RANK = 16
Q, K = MODULES[0], MODULES[1]


def refused(d, pattern, **kw):
    """validate_adapter refuses ``d`` with a message that names its file and matches."""
    with pytest.raises(PublishError) as info:
        validate_adapter(d, max_lora_rank=MAX_RANK, **kw)
    message = str(info.value)
    assert str(d) in message, message  # the file (or directory) is named
    assert re.search(pattern, message), message
    return message


def crafted(tmp_path, header, data_len=0, **kw):
    return write_adapter(tmp_path / "team" / "v0001",
                         weights=safetensors_bytes(header, data_len, **kw))


# -- what the adversarial run published ------------------------------------------------------
def test_a_good_adapter_passes(tmp_path):
    d = write_adapter(tmp_path / "team" / "v0001")
    assert validate_adapter(d, max_lora_rank=MAX_RANK)["r"] == 8


def test_config_r8_over_rank64_tensors(tmp_path):
    d = write_adapter(tmp_path / "team" / "v0001", tensors=lora_tensors(rank=64))
    refused(d, re.escape(f"{K} has rank 64 in its tensors but adapter_config.json says r=8"))


def test_r_as_a_string(tmp_path):
    d = write_adapter(tmp_path / "team" / "v0001", config_overrides={"r": "64"},
                      tensors=lora_tensors(rank=64))
    refused(d, re.escape("adapter_config.json: r is '64' (str), not a positive integer"))


def test_rank_pattern_of_64(tmp_path):
    d = write_adapter(tmp_path / "team" / "v0001",
                      config_overrides={"rank_pattern": {"q_proj": 64}},
                      tensors=lora_tensors(ranks={Q: 64}))
    refused(d, re.escape("LoRA rank 64 is above the servers' --max-lora-rank 16 "
                         "(rank_pattern['q_proj']=64)"))


def test_rank_pattern_that_the_tensors_do_not_follow(tmp_path):
    d = write_adapter(tmp_path / "team" / "v0001", config_overrides={"rank_pattern": {"q_proj": 4}})
    refused(d, re.escape(f"{Q} has rank 8 in its tensors but adapter_config.json says "
                         f"rank_pattern['q_proj']=4"))


def test_rank_pattern_that_the_tensors_follow_passes(tmp_path):
    d = write_adapter(tmp_path / "team" / "v0001",
                      config_overrides={"rank_pattern": {"q_proj": 4},
                                        "alpha_pattern": {"q_proj": 8}},
                      tensors=lora_tensors(ranks={Q: 4}))
    assert validate_adapter(d, max_lora_rank=MAX_RANK)["rank_pattern"] == {"q_proj": 4}


def test_a_safetensors_file_with_no_tensors(tmp_path):
    refused(crafted(tmp_path, {"__metadata__": {"format": "pt"}}), "holds no tensors")
    refused(crafted(tmp_path, {}), "holds no tensors")


def test_a_header_that_is_a_list(tmp_path):
    refused(crafted(tmp_path, []), re.escape("corrupt safetensors file (header is a JSON "
                                             "list, not an object)"))


# -- the tensors against each other and the config -------------------------------------------
def test_a_and_b_ranks_disagree(tmp_path):
    tensors = lora_tensors()
    tensors[f"base_model.model.{Q}.lora_B.weight"] = ("F32", [HIDDEN, 4])
    d = write_adapter(tmp_path / "team" / "v0001", tensors=tensors)
    refused(d, re.escape(f"{Q}: lora_A [8, 64] has rank 8 but lora_B [64, 4] has rank 4"))


def test_half_a_pair(tmp_path):
    tensors = lora_tensors()
    del tensors[f"base_model.model.{Q}.lora_B.weight"]
    d = write_adapter(tmp_path / "team" / "v0001", tensors=tensors)
    refused(d, re.escape(f"{Q} has lora_A but no lora_B"))


def test_tensors_that_are_not_lora_weights(tmp_path):
    tensors = {**lora_tensors(), "lm_head.weight": ("F32", [100, HIDDEN])}
    d = write_adapter(tmp_path / "team" / "v0001", tensors=tensors)
    refused(d, re.escape("tensor 'lm_head.weight' is not a LoRA weight"))


def test_integer_and_non_matrix_lora_tensors(tmp_path):
    d = write_adapter(tmp_path / "team" / "v0001", tensors=lora_tensors(dtype="I32"))
    refused(d, "lora_A.weight is I32, not a floating-point dtype")
    tensors = lora_tensors()
    tensors[f"base_model.model.{Q}.lora_A.weight"] = ("F32", [8, 4, 16])
    d = write_adapter(tmp_path / "team" / "v0002", tensors=tensors)
    refused(d, re.escape("q_proj.lora_A.weight has shape [8, 4, 16], not a matrix"))


def test_rank_zero_tensors(tmp_path):
    d = write_adapter(tmp_path / "team" / "v0001", tensors=lora_tensors(rank=0))
    refused(d, "has rank 0 in its tensors but adapter_config.json says r=8")


def test_pattern_keys_that_match_no_module(tmp_path):
    d = write_adapter(tmp_path / "team" / "v0001",
                      config_overrides={"alpha_pattern": {"gate_proj": 32}})
    refused(d, re.escape("alpha_pattern key 'gate_proj' matches no module of "
                         "adapter_model.safetensors"))


# -- config fields of the wrong type ---------------------------------------------------------
@pytest.mark.parametrize("overrides, message", [
    ({"r": True}, "r is True (bool), not a positive integer"),
    ({"r": 0}, "r is 0 (int), not a positive integer"),
    ({"r": -8}, "r is -8 (int), not a positive integer"),
    ({"r": 8.0}, "r is 8.0 (float), not a positive integer"),
    ({"lora_alpha": "16"}, "lora_alpha is '16' (str), not a number"),
    ({"target_modules": 5}, "target_modules is 5 (int), not a list of module names"),
    ({"target_modules": ["q_proj", 3]}, "target_modules is ['q_proj', 3] (list)"),
    ({"target_modules": []}, "target_modules is [] (list)"),
    ({"peft_type": "IA3"}, "peft_type is 'IA3'; only LoRA adapters (\"LORA\") can be served"),
    ({"peft_type": None}, "peft_type is None; only LoRA adapters"),
    ({"rank_pattern": [64]}, "rank_pattern is [64] (list), not an object"),
    ({"rank_pattern": {"q_proj": "8"}}, "rank_pattern['q_proj'] is '8' (str), not a positive "
                                        "integer rank"),
    ({"alpha_pattern": {"q_proj(": 8}}, "alpha_pattern key 'q_proj(' is not a valid pattern"),
    ({"use_dora": True}, "use_dora is True: DoRA cannot be served"),
    ({"bias": "all"}, "bias is 'all': trained biases cannot be served"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save is ['lm_head']"),
])
def test_config_fields_of_the_wrong_type(tmp_path, overrides, message):
    d = write_adapter(tmp_path / "team" / "v0001", config_overrides=overrides)
    refused(d, "adapter_config.json: " + re.escape(message))


def test_a_config_that_is_not_an_object(tmp_path):
    d = write_adapter(tmp_path / "team" / "v0001", config_text="[8]")
    refused(d, re.escape("adapter_config.json: a JSON list, not an object"))


# -- the safetensors header against the format and the file ----------------------------------
def test_entries_that_are_not_tensor_descriptions(tmp_path):
    name = f"base_model.model.{Q}.lora_A.weight"
    ok = {"dtype": "F32", "shape": [8, HIDDEN], "data_offsets": [0, 2048]}
    cases = [
        (5, "entry '{n}' is int, not an object with dtype, shape and data_offsets"),
        ({"dtype": "F32", "shape": [8, HIDDEN]}, "entry '{n}' has no data_offsets"),
        ({**ok, "dtype": "F33"}, "tensor '{n}' has unknown dtype 'F33'"),
        ({**ok, "dtype": ["F32"]}, "tensor '{n}' has unknown dtype ['F32']"),
        ({**ok, "shape": [8, "64"]}, "tensor '{n}' has shape [8, '64'], not a list of "
                                     "non-negative integers"),
        ({**ok, "shape": [8, -64]}, "tensor '{n}' has shape [8, -64]"),
        ({**ok, "shape": {"0": 8}}, "tensor '{n}' has shape {{'0': 8}}"),
        ({**ok, "data_offsets": [2048, 0]}, "tensor '{n}' has data_offsets [2048, 0], not "
                                            "[begin, end] with 0 <= begin <= end"),
        ({**ok, "data_offsets": [0, 2048.0]}, "tensor '{n}' has data_offsets [0, 2048.0]"),
        ({**ok, "data_offsets": [0, 1, 2048]}, "tensor '{n}' has data_offsets [0, 1, 2048]"),
        ({**ok, "data_offsets": None}, "tensor '{n}' has data_offsets None"),
    ]
    for i, (entry, message) in enumerate(cases):
        d = write_adapter(tmp_path / "team" / f"v{i + 1:04d}",
                          weights=safetensors_bytes({name: entry}, 2048))
        refused(d, "corrupt safetensors file \\(" + re.escape(message.format(n=name)))


def test_size_of_dtype_and_shape_against_the_offsets(tmp_path):
    name = f"base_model.model.{Q}.lora_A.weight"
    d = crafted(tmp_path, {name: {"dtype": "F32", "shape": [8, HIDDEN],
                                  "data_offsets": [0, 1024]}}, 1024)
    refused(d, re.escape(f"tensor '{name}' is F32 [8, 64]: 2048 bytes, but its data_offsets "
                         f"[0, 1024] span 1024 bytes"))


def test_overlapping_tensors(tmp_path):
    header, length = header_of(lora_tensors())
    a, b = f"base_model.model.{Q}.lora_A.weight", f"base_model.model.{Q}.lora_B.weight"
    header[b]["data_offsets"] = header[a]["data_offsets"]  # B read from A's bytes
    refused(crafted(tmp_path, header, length), re.escape(f"tensors '{a}' and '{b}' overlap"))


def test_offsets_past_the_end_of_the_file(tmp_path):
    header, length = header_of(lora_tensors())
    refused(crafted(tmp_path, header, length - 100),
            "corrupt safetensors file .*runs past the end of the file .*truncated")
    refused(crafted(tmp_path, header, 0, raw_header=b"{" + b" " * 50),
            "corrupt safetensors file .*header is not valid JSON")


def test_a_header_length_past_the_file(tmp_path):
    d = write_adapter(tmp_path / "team" / "v0001", weights=(10**6).to_bytes(8, "little") + b"{}")
    refused(d, re.escape("header length 1000000 runs past the end of the file (10 bytes"))


def test_gaps_and_trailing_bytes(tmp_path):
    header, length = header_of(lora_tensors())
    refused(crafted(tmp_path, header, length + 16),
            re.escape("16 bytes after the last tensor belong to no tensor"))
    first = next(k for k in header if k != "__metadata__")
    del header[first]  # its bytes are still in the file, before the rest
    refused(crafted(tmp_path, header, length),
            re.escape("bytes 0-2048 of the data belong to no tensor"))


def test_headers_that_break_json_readers(tmp_path):
    refused(crafted(tmp_path, None, raw_header=b"[" * 100_000),
            "header is not valid JSON \\(RecursionError")
    refused(crafted(tmp_path, None, raw_header=b'{"a": 1, "a": 2}'),
            re.escape("key 'a' appears twice in the header"))
    refused(crafted(tmp_path, None, raw_header=b'{"\xff": 1}'),
            "header is not valid JSON \\(UnicodeDecodeError")
    refused(crafted(tmp_path, {"__metadata__": {"format": 1}}),
            re.escape("__metadata__ is not an object of strings"))


def test_weights_that_are_not_a_regular_file(tmp_path):
    import os

    d = write_adapter(tmp_path / "team" / "v0001")
    (d / "adapter_model.safetensors").unlink()
    os.mkfifo(d / "adapter_model.safetensors")  # opening it to read would block forever
    refused(d, re.escape("corrupt safetensors file (not a regular file)"))


@pytest.mark.parametrize("special", ["dev_zero", "fifo", "huge", "directory"])
def test_a_config_that_is_not_a_small_regular_file_is_refused_quickly(tmp_path, special):
    """Issue 30.6: the config linked to /dev/zero grew the publisher to 19 GB until the OOM
    killer came; a FIFO hung it. Only a regular file of at most 1 MiB is read."""
    import os
    import time

    d = write_adapter(tmp_path / "team" / "v0001")
    config = d / "adapter_config.json"
    config.unlink()
    if special == "dev_zero":
        config.symlink_to("/dev/zero")
    elif special == "fifo":
        os.mkfifo(config)
    elif special == "huge":
        config.write_text('{"r": 8, "pad": "' + "x" * (2 << 20) + '"}')
    else:
        config.mkdir()
    t0 = time.monotonic()
    refused(d, "adapter config .*adapter_config.json: " + (
        "[0-9]+ bytes; a file read here is at most" if special == "huge"
        else re.escape("cannot read it (not a regular file)")))
    assert time.monotonic() - t0 < 5


# -- the base model --------------------------------------------------------------------------
def base_model(tmp_path, vocab=100):
    d = tmp_path / "base"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"hidden_size": HIDDEN, "vocab_size": vocab}))
    tensors = {f"{m}.weight": ("F32", [HIDDEN, HIDDEN]) for m in MODULES}
    tensors["model.embed_tokens.weight"] = ("F32", [vocab, HIDDEN])
    (d / "model.safetensors").write_bytes(safetensors_bytes(*header_of(tensors)))
    return d


def test_embedding_pairs_are_checked_against_the_base_embedding(tmp_path):
    base = base_model(tmp_path)
    emb = "base_model.model.model.embed_tokens"
    good = {**lora_tensors(), f"{emb}.lora_embedding_A": ("F32", [8, 100]),
            f"{emb}.lora_embedding_B": ("F32", [HIDDEN, 8])}
    d = write_adapter(tmp_path / "team" / "v0001", tensors=good)
    assert validate_adapter(d, base_model=base, max_lora_rank=MAX_RANK)["r"] == 8
    swapped = {**good, f"{emb}.lora_embedding_A": ("F32", [8, HIDDEN]),
               f"{emb}.lora_embedding_B": ("F32", [100, 8])}
    d = write_adapter(tmp_path / "team" / "v0002", tensors=swapped)
    refused(d, re.escape("embed_tokens.lora_embedding_A has shape [8, 64], which does not fit "
                         "model.embed_tokens [100, 64] of the base model"), base_model=base)


def test_a_module_the_base_lacks(tmp_path):
    base = base_model(tmp_path)
    d = write_adapter(tmp_path / "team" / "v0001",
                      tensors=lora_tensors(modules=["model.layers.0.mlp.gate_proj"]))
    refused(d, "adapts model.layers.0.mlp.gate_proj, which the base model .* does not have",
            base_model=base)


def test_a_base_model_directory_without_a_config(tmp_path):
    d = write_adapter(tmp_path / "team" / "v0001")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PublishError, match="not a model directory"):
        validate_adapter(d, base_model=tmp_path / "empty")


# -- nothing but PublishError, whatever the bytes --------------------------------------------
def _random_json(rng: random.Random, depth: int = 0):
    kinds = ["int", "neg", "float", "str", "none", "bool", "list", "dict"]
    kind = rng.choice(kinds if depth < 2 else kinds[:6])
    return {"int": lambda: rng.randrange(10**6), "neg": lambda: -rng.randrange(1, 99),
            "float": lambda: rng.random() * 100, "str": lambda: rng.choice(["F32", "x", ""]),
            "none": lambda: None, "bool": lambda: rng.random() < 0.5,
            "list": lambda: [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))],
            "dict": lambda: {rng.choice(["dtype", "shape", "data_offsets", "k"]):
                             _random_json(rng, depth + 1) for _ in range(rng.randrange(4))},
            }[kind]()


def test_mangled_files_raise_publish_error_or_pass(tmp_path):
    """Seeded mutations of a valid file: header bytes flipped, the file cut short, another
    header length, and JSON of the wrong shape in place of the header, of an entry or of one
    field. Each is refused with a PublishError naming the file, or passes whole; the counts are
    asserted so the test cannot pass by never reaching the checks."""
    header, length = header_of(lora_tensors())
    good = safetensors_bytes(header, length)
    n = int.from_bytes(good[:8], "little")
    names = [k for k in header if k != "__metadata__"]
    rng = random.Random(14)
    refusals = 0
    for i in range(400):
        data = bytearray(good)
        kind = i % 4
        if kind == 0:  # flip a few header bytes to JSON punctuation and digits
            for _ in range(rng.randint(1, 4)):
                data[8 + rng.randrange(n)] = rng.choice(b'{}[]",:0123456789-eEtrunl ')
        elif kind == 1:  # cut the file short
            data = data[:rng.randrange(len(data))]
        elif kind == 2:  # claim another header length
            data[:8] = rng.randrange(0, n + 64).to_bytes(8, "little")
        else:  # JSON of the wrong shape: the whole header, one entry or one field
            mangled = json.loads(json.dumps(header))
            where = rng.randrange(3)
            if where == 0:
                mangled = _random_json(rng)
            elif where == 1:
                mangled[rng.choice(names)] = _random_json(rng)
            else:
                entry = mangled[rng.choice(names)]
                entry[rng.choice(["dtype", "shape", "data_offsets"])] = _random_json(rng)
            data = bytearray(safetensors_bytes(mangled, length))
        d = write_adapter(tmp_path / "team" / f"v{i + 1:04d}", weights=bytes(data))
        try:
            validate_adapter(d, max_lora_rank=MAX_RANK)
        except PublishError as exc:
            assert str(d) in str(exc)
            refusals += 1
    assert refusals >= 390  # a handful of byte flips land in a name or leave the same JSON


def test_a_refused_adapter_reaches_no_server_and_no_registry_file(tmp_path):
    from agl_bridge.trainer.serving.publisher import Publisher
    from tests.scripted_server import ScriptedServer

    d = write_adapter(tmp_path / "team" / "v0001", tensors=lora_tensors(rank=64))
    with ScriptedServer(lora=True) as server:
        publisher = Publisher([server.base_url], tmp_path / "registry", max_lora_rank=MAX_RANK)
        with pytest.raises(PublishError, match="has rank 64 in its tensors"):
            publisher.publish(d, alias="team")
        assert server.requests == [] and server.adapters == {}
    assert publisher.live("team") is None
    assert not (tmp_path / "registry" / "history.json").exists()
