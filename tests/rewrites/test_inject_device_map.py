import pytest
from rewrite_case import assert_rewrites, assert_unchanged, run

from nbddp.export.rewrites.inject_device_map import InjectDeviceMap


def test_unsloth_loader_gets_a_device_map_in_its_own_layout():
    changes = assert_rewrites(
        InjectDeviceMap,
        """\
        model, tokenizer = FastLanguageModel.from_pretrained(
            model_name = "unsloth/Llama-3.2-1B",
            max_seq_length = max_seq_length,
            dtype = None,
            load_in_4bit = True,  # 4bit cuts memory use
        )
        """,
        """\
        model, tokenizer = FastLanguageModel.from_pretrained(
            model_name = "unsloth/Llama-3.2-1B",
            max_seq_length = max_seq_length,
            dtype = None,
            load_in_4bit = True,  # 4bit cuts memory use
            device_map = ddp.device_map(),
        )
        """,
    )
    assert changes == [(1, "added device_map=ddp.device_map() (each rank loads the model on its own GPU)")]


@pytest.mark.parametrize(
    "loader",
    [
        "FastModel",
        "FastVisionModel",
        "AutoModelForCausalLM",
        "transformers.AutoModelForCausalLM",
        "AutoModel",
        "AutoPeftModelForCausalLM",
        "LlamaForCausalLM",
        "Qwen2VLForConditionalGeneration",
    ],
)
def test_every_model_loader_is_matched(loader):
    assert_rewrites(
        InjectDeviceMap,
        f'model = {loader}.from_pretrained("m")\n',
        f'model = {loader}.from_pretrained("m", device_map=ddp.device_map())\n',
    )


@pytest.mark.parametrize("written", ['"auto"', "'balanced'", '"sequential"'])
def test_splitting_device_maps_are_replaced(written):
    changes = assert_rewrites(
        InjectDeviceMap,
        f"model = AutoModelForCausalLM.from_pretrained(\n    name,\n    device_map={written},  # fits?\n)\n",
        "model = AutoModelForCausalLM.from_pretrained(\n    name,\n    device_map=ddp.device_map(),  # fits?\n)\n",
    )
    assert changes == [
        (
            3,
            f"replaced device_map={written} (splits the model across GPUs; under torchrun each rank must hold its own copy)",
        )
    ]


@pytest.mark.parametrize("written", ['"unsloth"', "'unsloth_balanced'"])
def test_unsloths_planned_device_maps_are_replaced(written):
    # As Muse_Glimmer_(30B)-GRPO of unslothai/notebooks loads its model: Transformers (--backend hf) refused
    # "unsloth" ("the value needs to be a device name ... or 'auto'"), and Unsloth declines it under torchrun.
    changes = assert_rewrites(
        InjectDeviceMap,
        f"model, tokenizer = FastModel.from_pretrained(name, device_map = {written}, offload_embedding = True)\n",
        "model, tokenizer = FastModel.from_pretrained(name, device_map = ddp.device_map(), offload_embedding = True)\n",
    )
    assert changes == [(1, f"replaced device_map={written} (Unsloth's planner splits the model across GPUs; under "
                           "torchrun each rank must hold its own copy)")]


@pytest.mark.parametrize("written", ["0", '"cuda"', '"cuda:0"', '{"": 0}', "{'': 'cuda:0'}"])
def test_first_gpu_device_maps_are_replaced(written):
    changes = assert_rewrites(
        InjectDeviceMap,
        f"model = FastLanguageModel.from_pretrained(name, device_map = {written})\n",
        "model = FastLanguageModel.from_pretrained(name, device_map = ddp.device_map())\n",
    )
    assert changes == [(1, f"replaced device_map={written} (puts every rank on GPU 0; each rank must use its own GPU)")]


@pytest.mark.parametrize("written", ['{"model.embed": 0, "lm_head": 1}', "my_map", '"cpu"'])
def test_other_device_maps_are_kept_with_a_note(written):
    code, changes = run(InjectDeviceMap, f"model = AutoModel.from_pretrained(name, device_map={written})\n")
    assert code == f"model = AutoModel.from_pretrained(name, device_map={written})\n"
    assert len(changes) == 1
    assert changes[0][1].startswith(f"left device_map={written} as written")


@pytest.mark.parametrize("written", [
    '{"": int(os.environ["LOCAL_RANK"])}', "{'': int(os.environ.get('LOCAL_RANK', 0))}", '{"": local_rank}',
    '{"": PartialState().local_process_index}', 'int(os.environ["LOCAL_RANK"])',
])
def test_the_notebooks_own_local_rank_map_becomes_the_same_map_that_also_runs_on_a_cpu(written):
    code, changes = run(InjectDeviceMap, f"model = AutoModelForCausalLM.from_pretrained(name, device_map={written})\n")
    assert code == "model = AutoModelForCausalLM.from_pretrained(name, device_map=ddp.device_map())\n"
    assert changes == [(1, f"replaced device_map={written} (the notebook's own LOCAL_RANK map names the rank's GPU, "
                           "which a CPU run lacks; ddp.device_map() is the same map on GPUs and also runs on a CPU)")]


def test_a_local_rank_map_of_parts_of_the_model_is_kept_with_a_note():
    written = '{"model": local_rank, "lm_head": 0}'
    code, changes = run(InjectDeviceMap, f"model = AutoModelForCausalLM.from_pretrained(name, device_map={written})\n")
    assert code == f"model = AutoModelForCausalLM.from_pretrained(name, device_map={written})\n"
    assert changes == [(1, f"kept device_map={written}: the notebook's own LOCAL_RANK map puts each rank on its own "
                           "GPU (it needs GPUs; ddp.device_map() also runs on a CPU)")]


def test_double_star_arguments_are_not_second_guessed():
    code, changes = run(InjectDeviceMap, "model = AutoModel.from_pretrained(name, **options)\n")
    assert code == "model = AutoModel.from_pretrained(name, **options)\n"
    assert changes == [(1, "cannot see whether ** arguments set device_map; it should be ddp.device_map()")]


def test_tokenizers_and_other_calls_are_left_alone():
    assert_unchanged(
        InjectDeviceMap,
        """\
        tokenizer = AutoTokenizer.from_pretrained(name)
        processor = AutoProcessor.from_pretrained(name, device_map="auto")
        config = AutoConfig.from_pretrained(name)
        model = FastLanguageModel.get_peft_model(model, r=16)
        model = PeftModel.from_pretrained(model, "lora_model")
        model = FastLanguageModel.from_pretrained(name, device_map=ddp.device_map())
        """,
    )


def test_nested_loaders_are_found():
    assert_rewrites(
        InjectDeviceMap,
        """\
        def load(name):
            if name:
                return AutoModelForCausalLM.from_pretrained(name)
        """,
        """\
        def load(name):
            if name:
                return AutoModelForCausalLM.from_pretrained(name, device_map=ddp.device_map())
        """,
    )


def test_the_added_keyword_is_spaced_as_the_calls_last_keyword():
    assert_rewrites(
        InjectDeviceMap,
        'model = AutoModel.from_pretrained(name, dtype="auto", load_in_4bit = True)\n',
        'model = AutoModel.from_pretrained(name, dtype="auto", load_in_4bit = True, device_map = ddp.device_map())\n',
    )
    assert_rewrites(
        InjectDeviceMap,
        'model = AutoModel.from_pretrained(name, load_in_4bit = True, dtype="auto")\n',
        'model = AutoModel.from_pretrained(name, load_in_4bit = True, dtype="auto", device_map=ddp.device_map())\n',
    )
