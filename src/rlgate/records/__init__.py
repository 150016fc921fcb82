"""rlgate.records: the records ``rlgate serve --online`` keeps, below the store that persists them.

``feedback.py`` (:class:`FeedbackEvent`, :class:`FeedbackPage`, value checks) and ``tenants.py``
(:class:`Tenant`, the key digests of :class:`TenantKeys`). They import nothing from rlgate, so the
store (``store/online.py``) and the online mode above it (``online/``) both import them downward.
"""
