# What the module refuses about the accounts and the workspace roots, as the sentences of
# failed assertions: builtins only, so the module (default.nix asserts each is absent) and the
# offline check (check-offline.sh, which feeds it the broken forms) evaluate the same code.
#
#   owner   services.boxmaker.owner
#   users   the declared accounts, name -> { home, homeMode, createHome } (users.users)
#   roots   brokerd's [[workspace.roots]], each { path, writable ? false, ... }
{
  owner,
  users,
  roots ? [ ],
}:
let
  # Whether a mode like "700" or "0711" lets others through a directory (their x bit).
  othersMayEnter =
    mode:
    let
      last = builtins.substring (builtins.stringLength mode - 1) 1 mode;
    in
    builtins.elem last [
      "1"
      "3"
      "5"
      "7"
    ];

  inside = dir: path: path == dir || builtins.substring 0 (builtins.stringLength dir + 1) path == "${dir}/";

  # Directories no other user can pass on a NixOS system whatever the configuration says.
  closed = [
    "/root"
    "/run/user"
  ];

  ownerProblems =
    if users ? ${owner} then
      [ ]
    else
      [
        "services.boxmaker.owner `${owner}` is not an account of this configuration: declare users.users.${owner} (the owner's sockets are made with SocketUser=${owner}, which fails for an unknown user)"
      ];

  rootProblems = builtins.concatMap (
    r:
    map (
      dir:
      "workspace root ${r.path} lies in ${dir}, which no other user may enter: brokerd (bx-broker) could not open it and would not start. Use a directory outside the home directories, e.g. /srv/boxmaker/<name> (docs/install.md, \"Workspace roots\")"
    ) (builtins.filter (dir: inside dir r.path) closed)
    ++ builtins.concatMap (
      name:
      let
        u = users.${name};
      in
      if
        (u.createHome or false)
        && (u.home or "") != ""
        && inside u.home r.path
        && !(othersMayEnter (u.homeMode or "700"))
      then
        [
          "workspace root ${r.path} lies in ${u.home}, the home of ${name}, which is ${u.homeMode or "700"} (users.users.${name}.homeMode): brokerd (bx-broker) could not open it and would not start. Use a directory outside the home directories, e.g. /srv/boxmaker/<name>, or let others pass the home (homeMode = \"711\") and give bx-broker access to the root itself (docs/install.md, \"Workspace roots\")"
        ]
      else
        [ ]
    ) (builtins.attrNames users)
  ) roots;
in
ownerProblems ++ rootProblems
