"""What the tests share: real servers (``servers``, ``brokers``, ``secure_brokers``,
``tsdb``), harnesses (``agent_harness``, ``agent_core_harness``, ``controller_harness``),
the one fake clock (``clock``), the fake pynvml (``fakes``), data builders, ``paths``, and
the markers given from what a test uses (``markers``). No tests here."""
