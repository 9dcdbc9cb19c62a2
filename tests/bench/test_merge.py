import json

import pytest

from bench.merge import main, merge

SETUP = {"shape": "llama3-8b", "seq_len": 2048, "micro_batch_per_gpu": 2, "gradient_accumulation_steps": 1,
         "steps": 40, "warmup_steps": 8, "lora_r": 16, "concurrent": False, "flops_per_token": 3.2e10,
         "checkpointing_choice": {"chosen": "off"}}


def trial(label, round_index, tokens_per_s, world):
    return {"label": label, "round": round_index, "status": "ok", "world_size": world,
            "tokens_per_s": {"median": tokens_per_s}, "tokens_per_s_per_gpu": tokens_per_s / world, "mfu": 0.6,
            "peak_allocated_gib": [30.0] * world, "t_first_step_s": 50.0}


def call(commit, rounds):
    """A scaling_8b_device_tokens results file of one call: rounds of (1-GPU, 2-GPU, reference) tok/s."""
    trials = [t for index, (one, two, reference) in enumerate(rounds)
              for t in (trial("generated_1gpu", index, one, 1), trial("generated_2gpu", index, two, 2),
                        trial("reference_2gpu", index, reference, 2))]
    return {"experiment": "scaling_8b_device_tokens", "description": "d", "setup": dict(SETUP),
            "environment": {"commit": commit}, "trials": trials, "summary": {}}


def test_rounds_of_later_calls_follow_the_earlier_ones_and_ratios_are_taken_over_all():
    merged = merge([call("a", [(100, 190, 200), (100, 200, 200)]), call("b", [(100, 180, 190)])])
    assert [t["round"] for t in merged["trials"]] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [t["call"] for t in merged["trials"]] == [0] * 6 + [1] * 3
    assert merged["calls"] == [{"commit": "a"}, {"commit": "b"}] and "environment" not in merged
    scaling, versus_reference = merged["summary"]["comparisons"]
    assert scaling["tokens_per_s_per_gpu"]["per_pair"] == pytest.approx([0.95, 1.0, 0.9])
    assert versus_reference["tokens_per_s"]["per_pair"] == pytest.approx([0.95, 1.0, 180 / 190])
    assert merged["summary"]["variants"]["generated_2gpu"]["trials"] == 3


def test_a_merged_file_merges_again_with_its_calls_kept_apart():
    twice = merge([merge([call("a", [(100, 190, 200)]), call("b", [(100, 200, 200)])]), call("c", [(100, 180, 190)])])
    assert [t["call"] for t in twice["trials"]] == [0] * 3 + [1] * 3 + [2] * 3
    assert [t["round"] for t in twice["trials"]] == [0] * 3 + [1] * 3 + [2] * 3
    assert [c["commit"] for c in twice["calls"]] == ["a", "b", "c"]


def test_different_workloads_or_experiments_are_refused():
    longer = call("b", [(100, 180, 190)])
    longer["setup"]["steps"] = 30
    with pytest.raises(ValueError, match="different workloads \\(steps differ\\)"):
        merge([call("a", [(100, 190, 200)]), longer])
    other = {**call("b", [(100, 180, 190)]), "experiment": "scaling_8b"}
    with pytest.raises(ValueError, match="cannot merge 'scaling_8b'"):
        merge([call("a", [(100, 190, 200)]), other])


def test_command_line_writes_the_merged_file(tmp_path, capsys, monkeypatch):
    paths = []
    for name, rounds in (("a", [(100, 190, 200)]), ("b", [(100, 200, 200)])):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(call(name, rounds)))
    monkeypatch.setattr("sys.argv", ["merge", "--out", str(tmp_path / "merged.json"), *map(str, paths)])
    main()
    assert len(json.loads((tmp_path / "merged.json").read_text())["trials"]) == 6
    assert "2 calls" in capsys.readouterr().out
