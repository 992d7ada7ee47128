"""Drop-in replacements for the APIs of the original ELMo implementations, on top of hf-elmo's model:

* `hf_elmo.compat.allennlp`: AllenNLP's `Elmo`, `batch_to_ids` and `ElmoEmbedder`;
* `hf_elmo.compat.elmoformanylangs`: ELMoForManyLangs' `Embedder` and its `sents2elmo`;
* `hf_elmo.compat.tfhub`: TF-Hub ELMo's module call (`default`, or with `as_dict=True` `word_emb`,
  `lstm_outputs1`, `lstm_outputs2`, `elmo`, `default`).

`docs/migration.md` lists what is identical and what differs. The model modules never import this package, so a
saved model folder does not carry it.
"""
