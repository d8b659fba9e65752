"""Online DPO written as a driver over worker groups (see README.md)."""
