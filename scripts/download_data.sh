#!/usr/bin/env bash
# Downloads a dataset in the official file format the readers of src/data/datasets expect, checks
# its md5 sums and unpacks it. Usage: scripts/download_data.sh NAME [DIR]
# DIR defaults to data/NAME in this repository, where an empty data.root finds it.
set -euo pipefail

usage() {
  echo "usage: $0 cifar10|cifar100|svhn|fashion_mnist|imagenet [DIR]" >&2
  exit 2
}
[ $# -ge 1 ] && [ $# -le 2 ] || usage
name=$1
case $name in cifar10|cifar100|svhn|fashion_mnist|imagenet) ;; *) usage ;; esac
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${2:-$repo/data/$name}

# fetch URL MD5 FILE: downloads URL to DIR/FILE unless a copy with the right md5 is there.
fetch() {
  local url=$1 md5=$2 file=$dir/$3
  if [ -f "$file" ] && echo "$md5  $file" | md5sum --quiet -c - 2>/dev/null; then
    echo "$file: present, md5 ok"
    return
  fi
  echo "downloading $url"
  if command -v curl >/dev/null; then
    curl -fL --retry 3 -o "$file.part" "$url"
  else
    wget -O "$file.part" "$url"
  fi
  if ! echo "$md5  $file.part" | md5sum --quiet -c -; then
    echo "error: $url: md5 $(md5sum < "$file.part" | cut -d' ' -f1), expected $md5" >&2
    rm -f "$file.part"
    exit 1
  fi
  mv "$file.part" "$file"
}

[ "$name" = imagenet ] || mkdir -p "$dir"
case $name in
  cifar10)
    fetch https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz \
      c32a1d4ab5d03f1284b67883e8d87530 cifar-10-binary.tar.gz
    # Extracts cifar-10-batches-bin/{data_batch_1..5,test_batch}.bin; the reader finds that folder.
    tar -xzf "$dir/cifar-10-binary.tar.gz" -C "$dir"
    ;;
  cifar100)
    fetch https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz \
      03b5dce01913d631647c71ecec9e9cb8 cifar-100-binary.tar.gz
    tar -xzf "$dir/cifar-100-binary.tar.gz" -C "$dir"  # cifar-100-binary/{train,test}.bin
    ;;
  svhn)
    fetch http://ufldl.stanford.edu/housenumbers/train_32x32.mat \
      e26dedcc434d2e4c54c9b2d4a06d8373 train_32x32.mat
    fetch http://ufldl.stanford.edu/housenumbers/test_32x32.mat \
      eb5a983be6a315427106f1b78d5eb5d1 test_32x32.mat
    ;;
  fashion_mnist)
    # The readers take the .gz files as they are (Debian's dataset-fashion-mnist has the same).
    base=https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion
    fetch $base/train-images-idx3-ubyte.gz 8d4fb7e6c68d591d4c3dfef9ec88bf0d train-images-idx3-ubyte.gz
    fetch $base/train-labels-idx1-ubyte.gz 25c81989df183df01b3e8a0aad5dffbe train-labels-idx1-ubyte.gz
    fetch $base/t10k-images-idx3-ubyte.gz bef4ecab320f06d8554ea6380940ec79 t10k-images-idx3-ubyte.gz
    fetch $base/t10k-labels-idx1-ubyte.gz bb300cfdad3c16e7a12a480ee83cd310 t10k-labels-idx1-ubyte.gz
    ;;
  imagenet)
    cat <<EOF
ImageNet (ILSVRC-2012) needs a manual download: register at https://image-net.org, accept the
terms, and download ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar. Then lay them out as
  $dir/train/<wnid>/*.JPEG   (untar the train archive, then untar each of its 1000 class archives)
  $dir/val/<wnid>/*.JPEG     (move each validation image into its class folder, e.g. with the
                              widely used valprep.sh of the PyTorch ImageNet example)
Both splits must have the same 1000 class folders; labels follow their sorted names.
EOF
    ;;
esac
[ "$name" = imagenet ] || echo "$name: ready in $dir (an empty data.root finds $repo/data/$name)"
