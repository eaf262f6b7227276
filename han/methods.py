"""The explanation methods and the one ``explain`` vocabulary every caller takes (the pipeline, the
service's API, han-score's command line, the web page). No torch here, so a command line can import it cheaply."""

METHODS = ("attention", "attention_gradient", "integrated_gradients", "occlusion")
DEFAULT_METHOD = "attention"
SIGNED = frozenset({"attention_gradient", "integrated_gradients", "occlusion"})
ON_TORCH = frozenset(METHODS) - {"attention"}  # run on the torch network (han.attribution); attention needs none
WITHIN_SENTENCE = frozenset({"attention"})  # word weights relative to their sentence, not the document


def explain_method(explain: bool | str | None) -> str | None:
    """The method an ``explain`` request asks for: None or False none, True the default, else a method's name."""
    if explain is None or explain is False:
        return None
    if explain is True:
        return DEFAULT_METHOD
    if explain not in METHODS:
        raise ValueError(f"unknown explanation method {explain!r}; choose one of {', '.join(METHODS)}")
    return explain
