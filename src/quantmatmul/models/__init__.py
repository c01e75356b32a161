"""quantmatmul.models: real models as ONNX graphs for the quantizers' end-to-end measurements (all-MiniLM-L6-v2, sentences.py)."""
