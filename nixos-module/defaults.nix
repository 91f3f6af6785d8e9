# The defaults of services.boxmaker's typed options, as plain values: default.nix declares its
# options with them, and the workspace's test (tests/nix_configs.rs) renders configs.nix with
# them, so the configuration the test checks is the one a device with only `enable` and
# `owner` set runs.
rec {
  home = "/var/lib/boxmaker";

  # One slot's defaults (services.boxmaker.settings.inferproxy.slots.<name>, there in snake_case:
  # max_tokens, context_tokens), all but `model`.
  slot = {
    maxTokens = 4096;
    contextTokens = 100000;
    temperature = null;
  };

  inference = {
    provider = "script";
    baseUrl = null;
    apiKeyFile = null;
    script = null;
    slots = {
      main = slot // {
        model = "default";
      };
    };
  };

  tools = { };

  # services.boxmaker.ownerReadsJournal: the owner in systemd-journal, so that `journalctl
  # RUNBOOK=<anchor>` works without root (the twin adds its owner to the group the same way).
  ownerReadsJournal = true;
}
