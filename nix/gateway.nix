# The gateway image as a Nix closure: polar-hpc (./polar-hpc.nix) plus the few tools a gateway
# node runs around it. One derivation feeds both the login-node environment and the image, so
# they cannot drift apart.
#
#   import ./gateway.nix { pkgs; polar-hpc; }
#   => { root;     # buildEnv: bin/polar-hpc, bin/python, bash, coreutils, bwrap, ...
#        closure;  # closureInfo of root: store-paths (every path the image needs), registration
#        image; }  # docker-archive tarball of root, for `apptainer build x.sif docker-archive:...`
{ pkgs, polar-hpc }:
let
  root = pkgs.buildEnv {
    name = "polar-hpc-gateway-root";
    paths = [
      polar-hpc
      pkgs.bashInteractive pkgs.coreutils pkgs.findutils pkgs.gnugrep pkgs.gnused
      pkgs.gnutar pkgs.gzip pkgs.procps pkgs.cacert
      pkgs.bubblewrap # the sandbox backend where apptainer is not available inside the image
    ];
  };
in
{
  inherit root;
  closure = pkgs.closureInfo { rootPaths = [ root ]; };
  image = pkgs.dockerTools.buildLayeredImage {
    name = "polar-hpc-gateway";
    tag = "nix";
    contents = [ root ];
    compressor = "none"; # a plain tar, which apptainer's docker-archive reader takes as is
    config = {
      Entrypoint = [ "/bin/polar-hpc" ];
      Env = [ "PATH=/bin" "SSL_CERT_FILE=${pkgs.cacert}/etc/ssl/certs/ca-bundle.crt" ];
    };
  };
}
