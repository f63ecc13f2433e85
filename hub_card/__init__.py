"""Package data of seqbert (installed as `seqbert.hub_card`): the model-card template, `model_card_template.md`,
rendered by `seqbert.hub.render_model_card` with `huggingface_hub.ModelCard`."""
