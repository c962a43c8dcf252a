{
  description = "cutile_py: tile GPU kernels in Python, compiled to PTX by its own compiler";

  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs =
    { self, nixpkgs }:
    let
      systems = [
        "x86_64-linux"
        "aarch64-linux"
      ];
      forAllSystems = f: nixpkgs.lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
    in
    {
      devShells = forAllSystems (
        pkgs:
        let
          python = pkgs.python312;
          # From nixpkgs where the attribute surely exists. cuda-python (cuda.bindings) and
          # nvidia-nvjitlink are not reliably packaged there: the shellHook pip-installs them,
          # with the project, into .venv from the `dev` extra of pyproject.toml.
          pythonDeps = with python.pkgs; [
            pip
            numpy
            pytest
            mypy
            hypothesis
            typing-extensions
          ];
          # Shared libraries that manylinux wheels (cuda-bindings, nvjitlink) expect on the host.
          wheelLibs = pkgs.lib.makeLibraryPath [
            pkgs.stdenv.cc.cc.lib
            pkgs.zlib
          ];
        in
        {
          default = pkgs.mkShell {
            # buildInputs, as in the nixpkgs manual's venv recipe: python's setup hook then
            # puts these packages on PYTHONPATH.
            buildInputs = [ python ] ++ pythonDeps;
            packages = [
              pkgs.ruff
              pkgs.git
            ];

            shellHook = ''
              # The NVIDIA driver (libcuda.so.1) is the host's, never a nix package: on NixOS it
              # is under /run/opengl-driver/lib. Elsewhere, link only the driver's own libraries
              # into .venv/driver-lib, since putting the whole system lib dir on the path would
              # mix the host's glibc into nix-built programs.
              root=$(git rev-parse --show-toplevel 2>/dev/null || pwd)
              venv=$root/.venv

              driver_lib=/run/opengl-driver/lib
              if [ ! -e "$driver_lib/libcuda.so.1" ]; then
                for d in /usr/lib/wsl/lib /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64; do
                  if [ -e "$d/libcuda.so.1" ]; then
                    driver_lib=$venv/driver-lib
                    mkdir -p "$driver_lib"
                    ln -sf "$d"/libcuda.so* "$d"/libnvidia-*.so* "$driver_lib"/ 2>/dev/null || true
                    break
                  fi
                done
              fi
              export LD_LIBRARY_PATH="$driver_lib:${wheelLibs}''${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

              # mkShell pins SOURCE_DATE_EPOCH to 1980, which breaks building the editable wheel.
              unset SOURCE_DATE_EPOCH
              export PIP_DISABLE_PIP_VERSION_CHECK=1

              # The venv sees the nixpkgs packages above through PYTHONPATH, so pip installs
              # only what is missing. Recreated when its interpreter is gone (garbage-collected
              # store path); reinstalled when pyproject.toml changes.
              if ! "$venv/bin/python" -c "" 2>/dev/null; then
                (cd "$venv" 2>/dev/null && rm -rf bin lib lib64 include pyvenv.cfg .pyproject.sha256)
                python -m venv "$venv"
              fi
              . "$venv/bin/activate"
              stamp=$(sha256sum "$root/pyproject.toml" | cut -d" " -f1)
              if [ "$(cat "$venv/.pyproject.sha256" 2>/dev/null)" != "$stamp" ]; then
                pip install --quiet -e "$root[dev]" && echo "$stamp" > "$venv/.pyproject.sha256"
              fi

              # The ruff wheel pip installs is a dynamically linked binary that NixOS cannot run
              # without nix-ld: keep nixpkgs' ruff first on PATH.
              export PATH="${pkgs.ruff}/bin:$PATH"
            '';
          };
        }
      );
    };
}
