"""Keywords Transformers 5 and TRL 1.x renamed or removed, on the hf backend
(nbddp/fallback/rl_config_compat.py)."""
import dataclasses

import pytest
from trl import DPOConfig, GRPOConfig, SFTConfig

from nbddp.errors import UsageError
from nbddp.fallback import rl_config_compat


@dataclasses.dataclass
class NewConfig:
    """Stands in for a config of transformers 5 / TRL 1.x: the new names only."""

    warmup_steps: float = 0
    hub_token: str | None = None
    per_device_train_batch_size: int = 8
    use_liger_kernel: bool = False


@dataclasses.dataclass
class OldConfig(NewConfig):
    """A config that still has the old names (transformers 4.56, trl 0.22)."""

    warmup_ratio: float = 0.0
    max_prompt_length: int | None = 512


@pytest.fixture
def new_config():
    cls = type("GRPOConfig", (NewConfig,), {})
    rl_config_compat.patch_config(cls)
    return cls


def test_a_renamed_keyword_is_forwarded_with_unsloths_notice(new_config, capsys):
    config = new_config(warmup_ratio=0.1)
    assert config.warmup_steps == 0.1  # transformers 5 reads a float below 1 as the ratio
    assert capsys.readouterr().out == ("Unsloth: transformers renamed `warmup_ratio` to `warmup_steps`. Forwarding your "
                                       "value to `warmup_steps` - update your code when convenient.\n")


def test_trl_renames_name_trl(new_config, capsys):
    assert new_config(use_liger_loss=True).use_liger_kernel is True
    assert "Unsloth: TRL renamed `use_liger_loss` to `use_liger_kernel`." in capsys.readouterr().out


def test_given_both_names_the_new_one_is_kept(new_config, capsys):
    config = new_config(warmup_ratio=0.1, warmup_steps=5)
    assert config.warmup_steps == 5
    assert capsys.readouterr().out == (
        "Unsloth: `warmup_ratio` was renamed to `warmup_steps` by transformers and this GRPOConfig accepts only the "
        "new name. You set both, so `warmup_ratio` is ignored and your `warmup_steps` is kept.\n")


def test_a_legacy_none_does_not_replace_a_default(new_config, capsys):
    assert new_config(per_gpu_train_batch_size=None).per_device_train_batch_size == 8
    assert new_config(push_to_hub_token=None).hub_token is None  # the new name defaults to None itself: no loss
    assert new_config(per_gpu_train_batch_size=4).per_device_train_batch_size == 4
    assert capsys.readouterr().out.count("Unsloth:") == 2  # push_to_hub_token and the 4


def test_a_removed_keyword_is_dropped_with_unsloths_warning_and_the_advice(new_config, capsys):
    config = new_config(max_prompt_length=256, warmup_steps=3)
    assert not hasattr(config, "max_prompt_length") and config.warmup_steps == 3
    assert capsys.readouterr().out == (
        "Unsloth: `max_prompt_length` is not supported by the installed TRL's GRPOConfig and will be IGNORED - filter "
        "overlong prompts out of your dataset before training instead.\n")
    new_config(group_by_length=True)
    assert capsys.readouterr().out == (
        "Unsloth: `group_by_length` is not supported by the installed transformers's GRPOConfig and will be IGNORED - "
        'set `train_sampling_strategy = "group_by_length"` instead.\n')


def test_a_removed_keyword_given_on_the_command_line_is_refused_with_the_advice(new_config):
    with pytest.raises(UsageError, match=r"GRPOConfig\(max_prompt_length=\.\.\.\): the installed TRL \(\S+\) has no "
                                         r"`max_prompt_length` in GRPOConfig any more .*filter overlong prompts out of "
                                         r"your dataset before training instead\. Remove `max_prompt_length`.*"
                                         r"trl==0\.22\.2"):
        rl_config_compat.current_name(new_config, "max_prompt_length")


def test_a_keyword_a_later_trl_added_is_dropped_when_it_asks_for_what_this_one_does(capsys):
    old_sft = type("SFTConfig", (NewConfig,), {})  # TRL 0.22's SFTConfig: no loss_type
    rl_config_compat.patch_config(old_sft)
    assert old_sft(loss_type="nll", warmup_steps=3).warmup_steps == 3
    assert "Unsloth: `loss_type` is not a valid SFTConfig argument for the installed TRL and will be IGNORED" in (
        capsys.readouterr().out)
    with pytest.raises(UsageError, match=r"SFTConfig\(loss_type='dft'\): .* \(TRL 0\.23\.0 added it\).*"
                                         r"Install trl>=0\.23\.0, or remove `loss_type`"):
        old_sft(loss_type="dft")
    other = type("RewardConfig", (NewConfig,), {})  # another config: not a keyword TRL added to it
    rl_config_compat.patch_config(other)
    with pytest.raises(TypeError, match="loss_type"):
        other(loss_type="nll")


def test_an_unknown_keyword_is_left_to_the_config(new_config):
    with pytest.raises(TypeError, match="warmup_ration"):
        new_config(warmup_ration=0.1)


def test_a_config_that_has_the_old_names_takes_them_as_they_are(capsys):
    cls = type("OldGRPOConfig", (OldConfig,), {})
    rl_config_compat.patch_config(cls)
    config = cls(warmup_ratio=0.1, max_prompt_length=256)
    assert (config.warmup_ratio, config.warmup_steps, config.max_prompt_length) == (0.1, 0, 256)
    assert capsys.readouterr().out == ""


def test_only_rank_0_prints_the_notice(new_config, capsys, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    assert new_config(warmup_ratio=0.1).warmup_steps == 0.1
    assert capsys.readouterr().out == ""


def test_patching_twice_wraps_once(new_config):
    patched = new_config.__init__
    rl_config_compat.patch_config(new_config)
    assert new_config.__init__ is patched


@pytest.mark.parametrize("config_class", [SFTConfig, GRPOConfig, DPOConfig])
def test_the_notebooks_warmup_ratio_warms_up_on_this_stack(config_class, monkeypatch, tmp_path):
    # 49 GRPO notebooks, 12 SFT and the DPO one pass warmup_ratio (transformers 5 has none).
    monkeypatch.setattr(config_class, "__init__", config_class.__init__)  # restored after the test
    rl_config_compat.patch_config(config_class)
    config = config_class(output_dir=str(tmp_path), warmup_ratio=0.1, bf16=False, report_to="none")
    assert config.get_warmup_steps(100) == 10


def test_grpo_max_prompt_length_where_grpo_config_has_none(monkeypatch, tmp_path):
    monkeypatch.setattr(GRPOConfig, "__init__", GRPOConfig.__init__)
    rl_config_compat.patch_config(GRPOConfig)
    if "max_prompt_length" in {field.name for field in dataclasses.fields(GRPOConfig)}:  # TRL before 0.28
        assert GRPOConfig(output_dir=str(tmp_path), max_prompt_length=256, bf16=False).max_prompt_length == 256
    else:  # dropped, as Unsloth drops it
        assert not hasattr(GRPOConfig(output_dir=str(tmp_path), max_prompt_length=256, bf16=False), "max_prompt_length")
