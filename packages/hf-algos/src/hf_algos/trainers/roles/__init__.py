"""The worker groups a trainer drives: which worker each role runs (``workers``), where its
processes go (``placement``), the groups themselves with the actor -> rollout weight link
(``groups``), what the driver may call on them (``protocols``), what crosses into and out of
them (``batch_io``), the sampling settings the rollout receives (``sampling``) and a rollout
group that replaces its dead workers (``self_healing``)."""
