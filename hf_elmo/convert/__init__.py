"""The original formats: bilm-tf / AllenNLP options and weights, bilm-tf checkpoints, ELMoForManyLangs folders; exports
back to the original format and to ONNX."""
