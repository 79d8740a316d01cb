# unpack.sh - sourced by the GPU scripts: `source unpack.sh BUNDLE.tar.xz DIR`
# unpacks a bundle made by bundle.sh into /tmp/vlmd-bundle ($bundle), makes
# the output folder DIR ($out) and puts the bundle's libraries on the path.
bundle=/tmp/vlmd-bundle
rm -rf "$bundle" && mkdir -p "$bundle" && tar -C "$bundle" -xJf "$1" || exit 1
out=$2
mkdir -p "$out"
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
