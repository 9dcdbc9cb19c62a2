"""The kind of fine-tune a notebook does, from its code (`NotebookFacts`), for the sweep's table.

The first rule that matches wins, so a vision GRPO notebook counts as grpo and a TTS notebook whose model is a
Llama as audio:

| category | the code |
| --- | --- |
| other | no trainer's `.train()` (inference, a loop of its own), or sentence embeddings or a classifier |
| grpo-vllm | a GRPOTrainer, and a loader with `fast_inference=True` (Unsloth's vLLM generation) |
| grpo | a GRPOTrainer |
| dpo-orpo | a DPO, ORPO, KTO or CPO trainer |
| audio | speech data (`cast_column(..., Audio(...))`) or a speech model or codec (Whisper, SNAC, XCodec2, CSM) |
| vision | FastVisionModel, or Unsloth's vision collator |
| continued-pretraining | UnslothTrainer, an `embedding_learning_rate`, or LoRA on `embed_tokens`/`lm_head` |
| alpaca-sft | an `### Instruction:`/`### Response:` prompt and no chat template |
| conversational-sft | the rest: chat-formatted supervised fine-tuning |
"""
from tools.notebook_facts import NotebookFacts

CATEGORIES = ("alpaca-sft", "conversational-sft", "continued-pretraining", "dpo-orpo", "grpo", "grpo-vllm",
              "vision", "audio", "other")

NOT_CAUSAL_LM = ("SentenceTransformer", "FastSentenceTransformer", "SentenceTransformerTrainer",
                 "AutoModelForSequenceClassification")
PREFERENCE_TRAINERS = ("DPOTrainer", "ORPOTrainer", "KTOTrainer", "CPOTrainer")
SPEECH_MODELS = ("WhisperForConditionalGeneration", "SNAC", "XCodec2Model", "CsmForConditionalGeneration",
                 "BiCodecTokenizer")
CHAT_FORMATTING = ("get_chat_template", "apply_chat_template", "standardize_sharegpt", "standardize_data_formats",
                   "to_sharegpt")
ALPACA_MARKERS = ("### Instruction", "### Response")


def classify(facts: NotebookFacts) -> str:
    calls = facts.calls
    if not facts.trains_with_a_trainer() or any(name in facts.names for name in NOT_CAUSAL_LM):
        return "other"
    if "GRPOTrainer" in calls:
        return "grpo-vllm" if facts.keyword_true("fast_inference") else "grpo"
    if any(name in calls for name in PREFERENCE_TRAINERS):
        return "dpo-orpo"
    if _speech(facts):
        return "audio"
    if facts.loads_vision_model():
        return "vision"
    if "UnslothTrainer" in calls or "embedding_learning_rate" in facts.keywords or _trains_embeddings(facts):
        return "continued-pretraining"
    if any(facts.mentions(marker) for marker in ALPACA_MARKERS) and not any(name in calls for name in CHAT_FORMATTING):
        return "alpaca-sft"
    return "conversational-sft"


def _speech(facts: NotebookFacts) -> bool:
    return ("cast_column" in facts.calls and "Audio" in facts.calls) or any(name in facts.names for name in SPEECH_MODELS)


def _trains_embeddings(facts: NotebookFacts) -> bool:
    return any(isinstance(modules, list | tuple) and {"embed_tokens", "lm_head"} & set(modules)
               for modules in facts.keywords.get("target_modules", []))
