"""The online routes (``rlgate serve --online``): tenants, feedback, data deletion (``router.py``)."""
