"""Example agents written only against public SDKs (installed as ``rlgate_examples``)."""
