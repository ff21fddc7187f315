# Machine image for the training fleet: the Deep Learning Base GPU AMI (NVIDIA driver,
# Docker, NVIDIA container toolkit) plus the code image (the trainer with your code) and the
# boot service. `spotrain image bake ENV --image REPO@sha256:...` runs
#   packer init images && packer build -var environment=ENV -var region=R -var trainer_image=REF images
# The build writes the new image id to /spotrain/<environment>/image-id, where the fleet's
# launch template reads it.

packer {
  required_plugins {
    amazon = {
      source  = "github.com/hashicorp/amazon"
      version = "= 1.3.9"
    }
  }
}

variable "environment" {
  type        = string
  description = "spotrain environment whose image-id parameter the build updates"
}

variable "region" {
  type    = string
  default = "us-east-1"
}

variable "copy_regions" {
  type        = list(string)
  default     = []
  description = "the environment's other regions: the image is copied there (machine images are regional) and each region's image-id parameter updated"
}

variable "trainer_image" {
  type        = string
  description = "the code image `spotrain image build` printed: the trainer with your code, REPO@sha256:DIGEST"
}

variable "instance_type" {
  type    = string
  default = "g5.xlarge"
}

locals {
  timestamp = regex_replace(timestamp(), "[- TZ:]", "")
  # ACCOUNT.dkr.ecr.REGION.amazonaws.com/NAME@sha256:DIGEST -> the repository's ARN
  registry_host   = split("/", var.trainer_image)[0]
  repository_name = regex("^[^/]+/([^@]+)@", var.trainer_image)[0]
  repository_arn  = "arn:aws:ecr:${split(".", local.registry_host)[3]}:${split(".", local.registry_host)[0]}:repository/${local.repository_name}"
}

source "amazon-ebs" "trainer" {
  region        = var.region
  instance_type = var.instance_type
  ami_name      = "spotrain-${var.environment}-${local.timestamp}"
  ssh_username  = "ubuntu"
  encrypt_boot  = true
  ami_regions   = var.copy_regions

  source_ami_filter {
    filters = {
      name                = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *"
      virtualization-type = "hvm"
      architecture        = "x86_64"
    }
    owners      = ["amazon"]
    most_recent = true
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
  }

  imds_support = "v2.0"

  # The build machine pulls the image to bake with a role that may do only that.
  temporary_iam_instance_profile_policy_document {
    Version = "2012-10-17"
    Statement {
      Effect   = "Allow"
      Action   = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"]
      Resource = [local.repository_arn]
    }
    Statement {
      Effect   = "Allow"
      Action   = ["ecr:GetAuthorizationToken"]
      Resource = ["*"]
    }
  }

  launch_block_device_mappings {
    device_name           = "/dev/sda1"
    volume_size           = 200
    volume_type           = "gp3"
    encrypted             = true
    delete_on_termination = true
  }

  tags = {
    "spotrain:environment" = var.environment
    "spotrain:component"   = "trainer-image"
  }
}

build {
  sources = ["source.amazon-ebs.trainer"]

  provisioner "file" {
    source      = "${path.root}/bootstrap.sh"
    destination = "/tmp/bootstrap.sh"
  }

  provisioner "file" {
    source      = "${path.root}/spotrain-trainer.service"
    destination = "/tmp/spotrain-trainer.service"
  }

  provisioner "shell" {
    inline = [
      "set -euo pipefail",
      "sudo install -D -m 0755 /tmp/bootstrap.sh /opt/spotrain/bootstrap.sh",
      "sudo install -D -m 0644 /tmp/spotrain-trainer.service /etc/systemd/system/spotrain-trainer.service",
      "sudo systemctl daemon-reload",
      # On-call reaches machines with Session Manager only (no SSH, no open port): the base
      # image's agent must be there and enabled, or the build stops here.
      "snap services amazon-ssm-agent | grep -q enabled || { echo 'the base image has no enabled amazon-ssm-agent, which Session Manager needs' >&2; exit 1; }",
      # Docker logs in to the registry with the machine's role (the ECR credential helper):
      # here for the bake, on the fleet for a run that pins another image than the baked one.
      "sudo apt-get update -q",
      "sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -q amazon-ecr-credential-helper",
      "echo '{\"credsStore\": \"ecr-login\"}' | sudo install -D -m 0600 /dev/stdin /root/.docker/config.json",
      "sudo docker pull ${var.trainer_image}",
      "sudo docker tag ${var.trainer_image} spotrain-trainer:baked",
    ]
  }

  post-processor "manifest" {
    output = "packer-manifest.json"
  }

  post-processor "shell-local" {
    inline = [
      "python3 -c 'import json; print(*(p.replace(\":\", \" \") for p in json.load(open(\"packer-manifest.json\"))[\"builds\"][-1][\"artifact_id\"].split(\",\")), sep=\"\\n\")' > packer-images.txt",
      "while read -r region ami; do aws ssm put-parameter --region \"$region\" --name /spotrain/${var.environment}/image-id --type String --data-type aws:ec2:image --overwrite --value \"$ami\"; done < packer-images.txt",
    ]
  }
}
