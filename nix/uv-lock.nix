# Read uv.lock with builtins only (no nixpkgs), so it evaluates offline and CI can test it.
#
#   import ./uv-lock.nix { lockFile; system; pythonVersion; glibcVersion; }
#   => { direct   = [ "typer" ... ];              # polar-hpc's own runtime dependencies
#        packages = { <name> = { name; version; deps = [ <name> ... ];
#                                wheel = { url; sha256; filename; native; }; }; }; }
#
# `packages` is the runtime closure of polar-hpc (no optional dependencies, no dependency groups)
# for CPython `pythonVersion` with glibc `glibcVersion` on `system`: environment markers are
# evaluated for that target and each package gets the wheel pip would pick there. Anything it
# cannot decide (a marker it does not understand, a package without a usable wheel) stops
# evaluation with an error naming the package, rather than building something `uv sync` would not.
{ lockFile, system, pythonVersion, glibcVersion }:
let
  inherit (builtins)
    all any compareVersions elemAt filter foldl' fromTOML head isString length
    listToAttrs map match readFile split throw;

  root = "polar-hpc";
  lock = fromTOML (readFile lockFile);
  # The lock entry a dependency means: by name, and by version where uv locked several versions
  # of the package (a fork by environment); the dependency then names its version.
  lookup = dep:
    let
      named = filter (p: p.name == dep.name) lock.package;
      hits = if dep ? version then filter (p: p.version == dep.version) named else named;
    in
    if hits == [ ] then
      throw "uv.lock: package '${dep.name}' is required but not locked (run `uv lock`)"
    else if length hits > 1 then
      throw "uv.lock: '${dep.name}' is locked in several versions and its dependent names none"
    else head hits;

  machine = { x86_64-linux = "x86_64"; aarch64-linux = "aarch64"; }.${system}
    or (throw "nix/uv-lock.nix: unsupported system '${system}'");
  pyMinor = elemAt (split "\\." pythonVersion) 2; # "3.11.9" -> "11"
  pyTag = "cp3${pyMinor}";
  glibcMax = builtins.fromJSON (head (match "2\\.([0-9]+).*" glibcVersion)); # "2.40-66" -> 40

  # --- PEP 508 environment markers: `var op 'value'` clauses joined by `and` / `or` ---
  markerEnv = {
    sys_platform = "linux"; platform_system = "Linux"; os_name = "posix";
    implementation_name = "cpython"; platform_python_implementation = "CPython";
    platform_machine = machine;
    python_version = "3.${pyMinor}"; python_full_version = pythonVersion;
  };
  versionVars = [ "python_version" "python_full_version" ];
  pieces = sep: s: filter isString (split sep s);
  clause = where: c:
    let m = match "([a-z_]+) (==|!=|<=|>=|<|>) '([^']*)'" c; in
    if m == null || !(markerEnv ? ${head m}) then
      throw "uv.lock: ${where}: marker clause '${c}' is not understood by nix/uv-lock.nix"
    else
      let
        var = head m; op = elemAt m 1; want = elemAt m 2; have = markerEnv.${var};
        cmp = compareVersions have want;
      in
      if op == "==" then have == want
      else if op == "!=" then have != want
      else if !(any (v: v == var) versionVars) then
        throw "uv.lock: ${where}: '${op}' on non-version variable in '${c}'"
      else if op == "<" then cmp < 0
      else if op == "<=" then cmp <= 0
      else if op == ">" then cmp > 0
      else cmp >= 0;
  markerHolds = where: marker:
    if match ".*[()].*" marker != null then
      throw ("uv.lock: ${where}: parenthesised marker '${marker}'"
        + " is not understood by nix/uv-lock.nix")
    else any (conj: all (clause where) (pieces " and " conj)) (pieces " or " marker);

  # The dependencies of a lock entry that apply to this target.
  depsOf = p:
    filter (d: !(d ? marker) || markerHolds "${p.name} -> ${d.name}" d.marker)
      (p.dependencies or [ ]);
  rootEntry = lookup { name = root; };

  # Walk of the dependency graph from the root: { <name> = <lock entry>; } for the closure.
  closure =
    let
      step = seen: todo:
        if todo == [ ] then seen
        else
          let d = head todo; rest = builtins.tail todo; in
          if seen ? ${d.name} then step seen rest
          else let p = lookup d; in step (seen // { ${d.name} = p; }) (rest ++ depsOf p);
    in
    step { } (depsOf rootEntry);

  # --- wheel choice: the best-ranked tag, in the order of `packaging.tags.sys_tags()` ---
  # for CPython 3.<minor> on manylinux with glibc <= glibcMax (pip's and uv's order).
  minor = builtins.fromJSON pyMinor;
  downFrom = hi: lo: if hi < lo then [ ] else [ hi ] ++ downFrom (hi - 1) lo;
  legacy = { "17" = "manylinux2014"; "12" = "manylinux2010"; "5" = "manylinux1"; };
  platforms = builtins.concatMap (g:
    [ "manylinux_2_${toString g}_${machine}" ]
    ++ (if legacy ? ${toString g} then [ "${legacy.${toString g}}_${machine}" ] else [ ]))
    (downFrom glibcMax (if machine == "x86_64" then 5 else 17));
  tagsFor = py: abi: plats: map (plat: "${py}-${abi}-${plat}") plats;
  pyRange = [ "py3${pyMinor}" "py3" ] ++ map (m: "py3${toString m}") (downFrom (minor - 1) 0);
  rankedTags =
    builtins.concatMap (abi: tagsFor pyTag abi platforms) [ pyTag "abi3" "none" ]
    ++ builtins.concatMap (m: tagsFor "cp3${toString m}" "abi3" platforms) (downFrom (minor - 1) 2)
    ++ builtins.concatMap (py: tagsFor py "none" platforms) pyRange
    ++ [ "${pyTag}-none-any" ] ++ map (py: "${py}-none-any") pyRange;
  rank = listToAttrs (builtins.genList (i: { name = elemAt rankedTags i; value = i; })
    (length rankedTags));
  # A wheel's rank: its best tag ("py2.py3-none-any" carries py2-none-any and py3-none-any).
  wheelRank = filename:
    let
      parts = pieces "-" (builtins.substring 0 (builtins.stringLength filename - 4) filename);
      n = length parts;
      tagSet = i: pieces "\\." (elemAt parts (n - i));
      ranks = builtins.concatMap (py: builtins.concatMap (abi:
        map (plat: rank."${py}-${abi}-${plat}" or null) (tagSet 1)) (tagSet 2)) (tagSet 3);
    in
    foldl' (best: r: if r != null && (best == null || r < best) then r else best) null ranks;
  pickWheel = p:
    let
      ranked = map (w:
        let filename = baseNameOf w.url; in
        { inherit filename; inherit (w) url; rank = wheelRank filename;
          sha256 = builtins.replaceStrings [ "sha256:" ] [ "" ] w.hash; })
        (p.wheels or [ ]);
      best = foldl' (b: w: if w.rank != null && (b == null || w.rank < b.rank) then w else b)
        null ranked;
    in
    if best == null then
      throw ("uv.lock: ${p.name} ${p.version} has no wheel for CPython 3.${pyMinor}"
        + " with glibc ${glibcVersion} on ${system}")
    else {
      inherit (best) url sha256 filename;
      native = match ".*-any\\.whl" best.filename == null; # binaries to patch for the store
    };
in
{
  direct = map (d: d.name) (depsOf rootEntry);
  packages = builtins.mapAttrs (_: p: {
    inherit (p) name version;
    deps = map (d: d.name) (depsOf p);
    wheel = pickWheel p;
  }) closure;
}
