"""The semantic cache's parts: the sentence encoder (``encoder``, also ``/v1/embeddings``),
the precision check a hit must pass (``guard``) and the labelled pairs it is measured on
(``labelled_pairs.yaml``, ``precision``)."""
