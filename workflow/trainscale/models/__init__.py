"""Models: the builders of every catalog model, for PyTorch (`torch_models`) and Keras
(`keras_models`), from the shared layer specs in `builders`.
May import: plan, data.
"""
