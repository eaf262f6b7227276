"""The explanation methods, declared once: han.attribution computes them, the service's API, han-score's
command line and the web page take these names. No torch here, so a command line can import it cheaply."""

METHODS = ("attention", "attention_gradient", "integrated_gradients", "occlusion")
DEFAULT_METHOD = "attention"
SIGNED = frozenset({"attention_gradient", "integrated_gradients", "occlusion"})
