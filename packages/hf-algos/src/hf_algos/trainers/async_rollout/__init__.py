"""The async modes' generation pipeline (``pipeline``), the policy versions it tracks per
token (``versions``) and partial rollouts (``partial``)."""
