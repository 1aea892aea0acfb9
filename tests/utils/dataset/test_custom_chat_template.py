"""`model.custom_chat_template` replaces the tokenizer's chat template wherever verl loads it."""

from verl.utils import embedded_default
from verl.utils.tokenizer import hf_tokenizer


def test_custom_chat_template_replaces_the_shipped_one():
    path = embedded_default.model_path()
    messages = [{"role": "user", "content": "12+30"}]
    shipped = hf_tokenizer(path).apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    template = "{% for m in messages %}Q: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}A:{% endif %}"
    custom = hf_tokenizer(path, chat_template=template)
    assert custom.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == "Q: 12+30\nA:"
    assert shipped != "Q: 12+30\nA:"
    # no template given: unchanged
    assert hf_tokenizer(path, chat_template=None).chat_template == hf_tokenizer(path).chat_template
