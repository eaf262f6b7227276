"""The way back from production: the inference log, feedback, the monitor. The service logs what it
answered for each document (``inference_log``) and records its predictions in a durable store, where the
labels that clients send back as feedback join them (``feedback_store``), so that a monitor can watch a
model's accuracy in use, not only its accuracy on a test split."""
